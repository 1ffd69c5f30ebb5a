"""The orphan reaper: servers left running by a harness that no longer exists (killed, crashed, lost its node).

A row is opened `running`, with the server's pid and process group, before its server starts; a row still
`running` whose harness is gone is an orphan. Its server group is killed, but only a process whose command
line is the recorded argv (pids are reused), and the row is marked `interrupted` so the next run runs it again.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import psutil

from servematrix.run import hostinfo
from servematrix.stages import serve
from servematrix.store.store import Store, harness_alive


def reap_orphans(store: Store) -> list[int]:
    """Rows left `running` by a harness that no longer exists: kill their server groups, mark them interrupted."""
    killed: list[int] = []
    here = hostinfo.host().hostname
    for row in store.running():
        if (row.get("host") or {}).get("hostname") not in (None, here):
            continue  # a row merged from another machine: its pids mean nothing here
        owner = row.get("harness_pid")
        if owner and owner != os.getpid() and harness_alive(row, here):
            continue  # another live harness owns it
        pid, pgid = row.get("server_pid"), row.get("server_pgid")
        if pid and _is_server(pid, row.get("argv") or []):
            killed += serve.kill_tree(pid, pgid, grace_s=5.0)
        elif pgid and not psutil.pid_exists(pgid):
            # The leader is gone but its workers (e.g. sglang schedulers) may live on in its group.
            killed += serve.kill_tree(pgid, pgid, grace_s=5.0)
        store.finish(
            row["run_id"], row["cell_id"], verdict="interrupted", excerpt="the harness stopped while this cell ran"
        )
    return killed


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
