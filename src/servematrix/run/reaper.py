"""The orphan reaper: servers left running by a harness that no longer exists (killed, crashed, lost its node).

A row is opened `running`, with the server's pid and process group, before its server starts; a row still
`running` whose harness is gone is an orphan, and is marked `interrupted` so the next run runs it again. Its
server is killed only when this host's harness provably started it: the process carries the row's marker in
its environment (`serve.HARNESS_MARKER`, set at launch), started after the row did, and (the group's leader)
has the recorded argv. A pid or group a row merely names (a crafted or merged row, pid 1) is never touched:
`merge` drops the pids of the running rows it brings, and a row of another host, or of none, kills nothing.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from datetime import datetime

import psutil

from servematrix.run import hostinfo
from servematrix.stages import serve
from servematrix.store.store import Row, Store, harness_alive


def reap_orphans(store: Store) -> list[int]:
    """Rows left `running` by a harness that no longer exists: kill their server groups, mark them interrupted."""
    killed: list[int] = []
    here = hostinfo.host().hostname
    for row in store.running():
        hostname = row.on_host.hostname
        if hostname not in (None, here):
            continue  # a row merged from another machine: its pids mean nothing here
        owner = row.harness_pid
        if owner and owner != os.getpid() and harness_alive(row, here):
            continue  # another live harness owns it
        if hostname == here:
            killed += serve.kill_processes(_our_servers(row), grace_s=5.0)
        store.finish(row.run_id, row.cell_id, verdict="interrupted", excerpt="the harness stopped while this cell ran")
    return killed


_START_SLACK_S = 2.0  # started_at has one-second resolution


def _our_servers(row: Row) -> list[psutil.Process]:
    """The processes of a row's server that this harness started: the recorded leader (its argv too) and its
    descendants, and the members of its group (the leader may be gone, its workers not), each one carrying
    the row's marker and younger than the row."""
    marker = serve.harness_marker(row.run_id, row.cell_id)
    try:
        since = datetime.fromisoformat(str(row.started_at)).timestamp() - _START_SLACK_S
    except (TypeError, ValueError):
        return []
    pid, pgid = row.server_pid, row.server_pgid
    found: list[psutil.Process] = []
    if pid and _marked(pid, marker, since) and _is_server(pid, row.argv or []):
        try:
            root = psutil.Process(pid)
            found = [root, *(p for p in root.children(recursive=True) if _marked(p.pid, marker, since))]
        except psutil.NoSuchProcess:
            found = []
    if pgid:
        found += [p for p in serve._group_members(pgid) if p not in found and _marked(p.pid, marker, since)]
    return found


def _marked(pid: int, marker: str, since: float) -> bool:
    try:
        proc = psutil.Process(pid)
        return proc.environ().get(serve.HARNESS_MARKER) == marker and proc.create_time() >= since
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
        return False


def _is_server(pid: int, argv: Sequence[str]) -> bool:
    """Guard against pid reuse: only a process whose command line is the recorded server argv."""
    try:
        cmdline = psutil.Process(pid).cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False
    # The launcher may resolve argv[0] (python -> /env/bin/python), so compare the arguments only.
    tail = list(argv[1:])
    if not tail:
        return bool(cmdline)
    live = cmdline[-len(tail) :]
    return len(live) == len(tail) and all(_same_arg(stored, seen) for stored, seen in zip(tail, live, strict=True))


def _same_arg(stored: str, live: str) -> bool:
    """The stored argv is redacted: a masked element matches whatever secret the live one holds there."""
    if stored == live:
        return True
    for mask in ("***", "[REDACTED]"):
        if mask in stored:
            head, tail = stored.split(mask)[0], stored.split(mask)[-1]
            return len(live) >= len(head) + len(tail) and live.startswith(head) and live.endswith(tail)
    return False
