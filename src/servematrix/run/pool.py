"""A concurrent pre-flight: on a host that serves none of them, environments' CPU pre-flights side by side.

Run one environment at a time, a host waits on one pre-flight while its other resources idle. With `--jobs N`
(`RunOptions.jobs`) up to N environments this host does not serve run at once, each in a process of its own
(`packjob.py`), within the bound of `room` (a core, PREFLIGHT_MEMORY and the import check's `cost_gb` of disk
each). Environments this host serves are never run beside anything (a benchmark measures the host). On
SIGINT or SIGTERM a job stops what it started; whatever is still alive after STOP_GRACE_S is killed.

More, with the measurements behind it: docs/design-notes.md#srcservematrixrunpoolpy
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pickle
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import psutil
from rich.console import Console

from servematrix.backends import Backend
from servematrix.engines import Engine
from servematrix.planning.cells import cell_bound
from servematrix.planning.plan import Plan
from servematrix.records.cell import Cell
from servematrix.run import reuse
from servematrix.run.packing import Packed, PackedJob, finished_verdicts, job_environment
from servematrix.run.progress import RunProgress, relayed, wrap_free
from servematrix.run.reaper import reap_orphans
from servematrix.run.runplan import RunOptions, gpu_ready
from servematrix.stages import importcheck
from servematrix.stages.locking import default_lock_dir, resolve_request
from servematrix.stages.resolve import resolve_cached
from servematrix.store.store import Store
from servematrix.util import exclusive

GIB = 1024**3
# What one pre-flight holds in memory at a time: sglang's load probe keeps the release imported (1-3 GB,
# loadprobe.py); an import check's imports are budgeted alike (importcheck.room).
PREFLIGHT_MEMORY = 3 * GIB
DEFAULT_DISK_GB = 10.0  # one import check's install, for an engine whose data gives no `cost_gb`
POLL_S = 0.2
OUTPUT_GRACE_S = 10.0  # a job's output read after its process ended, unless a program it left holds it open
STOP_GRACE_S = 30.0  # a job stopping its programs (the load probe is given 10 s) before it is killed


@dataclass(frozen=True, kw_only=True)
class Room:
    """How many pre-flights this host has room for at once, and what bounds it."""

    cores: int
    memory: int  # by available memory
    disk: int  # by free disk where uv's cache and the venvs grow

    @property
    def jobs(self) -> int:
        return max(1, min(self.cores, self.memory, self.disk))

    def line(self) -> str:
        return f"{self.cores} core(s), memory for {self.memory}, disk for {self.disk}"


def room(cache_dir: Path, engine: Engine) -> Room:
    """This host's room for pre-flights at once: a core, PREFLIGHT_MEMORY and the engine's import check disk each."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    each_disk = (engine.import_check.cost_gb or DEFAULT_DISK_GB) * 1e9
    where = next(p for p in (Path(cache_dir), *Path(cache_dir).resolve().parents) if p.exists())
    return Room(
        cores=cores,
        memory=int(psutil.virtual_memory().available // PREFLIGHT_MEMORY),
        disk=int(shutil.disk_usage(where).free // each_disk),
    )


def envs_to_pool(
    plan: Plan,
    options: RunOptions,
    todo: Mapping[str, Sequence[Cell]],
    known: reuse.Reuse,
    but: Collection[str] = (),
) -> dict[str, Sequence[Cell]]:
    """The environments of `todo` whose pre-flights run side by side (env id -> its cells), or none: with
    `jobs` above 1 and the import check among the stages, those this host does not serve (nor packs, `but`)
    with a cell to decide, two or more. Without the import check nothing heavy runs (the load pre-flight runs
    in the lock the import check installs), and each job would find out for itself what the run learns once
    (an index-less host: one pip attempt a job instead of one a run)."""
    if options.jobs < 2 or "import" not in options.stages:
        return {}
    wanted: dict[str, Sequence[Cell]] = {}
    for env_id, cells in todo.items():
        env = cells[0].env
        if env_id in but or (gpu_ready(env) and "build" in options.stages):
            continue  # served here: one at a time, nothing beside it
        replays = [known.replay(c, this_host_lacks_gpus=not gpu_ready(env)) for c in cells if c.applicable]
        if all(r is not None and r.verdict is not None for r in replays):
            continue  # every cell reused (or none applicable): nothing to run beside another
        wanted[env_id] = cells
    return wanted if len(wanted) > 1 else {}


def import_check(lockfile: Path, engine: Engine, *, python_version: str, cache_dir: Path) -> importcheck.ImportCheck:
    """`importcheck.import_check`, one process at a time per lock key: its venv is named by the key, and a
    second process of the same lock body reads the first one's result instead of installing beside it."""
    key = importcheck.lock_key(lockfile, engine)
    with exclusive(Path(cache_dir) / "import" / "claims" / f"{key}.lock"):
        return importcheck.import_check(lockfile, engine, python_version=python_version, cache_dir=cache_dir)


def queue_order(plan: Plan, options: RunOptions, envs: Mapping[str, Sequence[Cell]]) -> list[str]:
    """The environments in plan order, each lock body's first before any body's second (the second then reads
    the first's import check); a body not known yet (no current lock) is the environment's own."""
    lock_dir = options.lock_dir or default_lock_dir(plan)
    rounds: dict[str, int] = {}
    order: list[tuple[int, int, str]] = []
    for index, env_id in enumerate(envs):
        current = resolve_cached(resolve_request(plan, env_id), out_dir=lock_dir)
        body = env_id
        if current is not None and current.lockfile is not None:
            body = importcheck.lock_key(current.lockfile, plan.spec.engine)
        rounds[body] = rounds.get(body, -1) + 1
        order.append((rounds[body], index, env_id))
    return [env_id for _, _, env_id in sorted(order)]


@dataclass(kw_only=True)
class _Job:
    env_id: str
    process: subprocess.Popen[bytes]
    ended: bool = False  # its output is read to the end
    exited: float | None = None  # when its process was seen ended

    def finished(self) -> bool:
        """Its process ended and its output is read; or, a while after, a program it left holds its output."""
        if self.process.poll() is None:
            return False
        self.exited = self.exited or time.monotonic()
        return self.ended or time.monotonic() - self.exited > OUTPUT_GRACE_S


def run_pooled(
    plan: Plan,
    backend: Backend,
    options: RunOptions,
    envs: Mapping[str, Sequence[Cell]],
    *,
    store: Store,
    console: Console,
    progress: RunProgress,
) -> Packed:
    """Run each environment's cells in a job of its own, `options.jobs` at a time; show their progress as one.
    SIGINT/SIGTERM (KeyboardInterrupt) stops every job, and what it started, before it is raised again."""
    say = lambda text: wrap_free(console, f"servematrix: {text}")  # noqa: E731
    waiting = queue_order(plan, options, envs)
    slots = min(options.jobs, len(waiting))
    say(
        f"pre-flight: {len(waiting)} environment(s) ({sum(len(c) for c in envs.values())} cell(s)), {slots} at "
        f"once; each one's log: {_log(options, '<env>')}"
    )
    cells = {c.id: c for found in envs.values() for c in found}
    lines: queue.Queue[tuple[str, str | None]] = queue.Queue()
    outcome = Packed(host_gpus=0)
    shown: set[str] = set()  # cells whose verdict the progress has counted
    running: dict[str, _Job] = {}
    began = time.monotonic()
    handed = dataclasses.replace(options, jobs=1)  # a job runs its environment alone
    max_cells = sum(cell_bound(plan.spec))

    def show(env_id: str, line: str) -> None:
        event = relayed(line)
        if event is None:
            wrap_free(console, f"env {env_id}: {line}")
            return
        cell = cells.get(str(event.get("cell")))
        if "reused" in event:
            outcome.reused += int(event["reused"])
            outcome.owned.update(event.get("owned") or {})
        elif cell is not None and "stage" in event:
            progress.stage(cell, str(event["stage"]))
        elif cell is not None and "verdict" in event and cell.id not in shown:
            shown.add(cell.id)
            progress.finished(cell, str(event["verdict"]))
        elif cell is not None and "line" in event:
            progress.note(cell, str(event["line"]))

    def done(job: _Job) -> None:
        del running[job.env_id]
        found = finished_verdicts(store, options.run_id, envs[job.env_id])
        outcome.verdicts.update(found)
        for cell in envs[job.env_id]:
            if cell.id in found and cell.id not in shown:
                shown.add(cell.id)
                progress.finished(cell, found[cell.id])
        log = _log(options, job.env_id)
        if job.process.returncode:
            outcome.failed[job.env_id] = f"its pre-flight job's process exited {job.process.returncode}; its log: {log}"
            say(f"env {job.env_id}: its process exited {job.process.returncode}, see {log}")

    try:
        while waiting or running:
            while waiting and len(running) < slots:
                env_id = waiting.pop(0)
                handed_job = PackedJob(
                    matrix=plan.spec.path,
                    cell_ids=tuple(c.id for c in envs[env_id]),
                    max_cells=max_cells,
                    options=handed,
                    backend=backend,
                    placement=None,
                    harness_pid=os.getpid(),
                    relay=True,
                )
                process = _spawn(handed_job, env_id, lines, _log(options, env_id))
                running[env_id] = _Job(env_id=env_id, process=process)
            with contextlib.suppress(queue.Empty):
                env_id, line = lines.get(timeout=POLL_S)
                if line is None:
                    if env_id in running:
                        running[env_id].ended = True
                else:
                    show(env_id, line)
            for ended in [j for j in running.values() if j.finished()]:
                done(ended)
    except KeyboardInterrupt:
        stop([j.process for j in running.values()])
        reap_orphans(store)
        raise
    say(f"pre-flight: {len(envs)} environment(s) in {time.monotonic() - began:.0f} s, {slots} at once")
    # In plan order, as a run one environment at a time lists them (not in the order the jobs ended).
    outcome.verdicts = {c: outcome.verdicts[c] for c in cells if c in outcome.verdicts}
    return outcome


def _log(options: RunOptions, env_id: str) -> Path:
    return options.workdir / "logs" / options.run_id / f"preflight-{env_id}.log"


def _spawn(
    job: PackedJob, env_id: str, lines: queue.Queue[tuple[str, str | None]], log: Path
) -> subprocess.Popen[bytes]:
    """The job's process, its output read line by line into `lines` (then None) and kept in its log."""
    log.parent.mkdir(parents=True, exist_ok=True)
    process = subprocess.Popen(
        [sys.executable, "-m", "servematrix.run.packjob"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=job_environment(),
        # Its own session: a terminal's Ctrl-C reaches the harness alone, which stops each job once.
        start_new_session=True,
    )
    assert process.stdin is not None and process.stdout is not None
    process.stdin.write(pickle.dumps(job))
    process.stdin.close()
    threading.Thread(
        target=_read, args=(env_id, process.stdout, lines, log), name=f"servematrix-preflight-{env_id}", daemon=True
    ).start()
    return process


def _read(env_id: str, stream: IO[bytes], lines: queue.Queue[tuple[str, str | None]], log: Path) -> None:
    with log.open("wb") as kept:
        for line in stream:
            kept.write(line)
            kept.flush()
            lines.put((env_id, line.decode("utf-8", "replace").rstrip("\n")))
    lines.put((env_id, None))


def stop(processes: Sequence[subprocess.Popen[bytes]], grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM every job and wait for it; then kill a job, and anything it had started, still alive."""
    started = [p for proc in processes for p in _descendants(proc.pid)]
    for proc in processes:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for proc in processes:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    for left in started:
        with contextlib.suppress(psutil.Error):
            left.kill()  # psutil checks it is the process it saw (its start time), not a pid used again


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []
