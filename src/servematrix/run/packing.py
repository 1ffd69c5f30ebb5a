"""A packed run: the environments that need this host's GPUs run at the same time, on disjoint GPU sets.

On a host with several GPUs (or stand-ins, see hostinfo), every environment whose cells need GPUs is a job
(`planning/schedule.py`): its cells in turn, sharing its build, their server starts interleaved as in any run. Jobs
start longest first as GPUs free up. Each runs in a process of its own (`packjob.py`, handed its job on
stdin): the ordinary pipeline over its cells, with CUDA_VISIBLE_DEVICES naming its GPUs (numbered as
nvidia-smi numbers them) and its CPU affinity set to theirs. Its servers and benchmark client inherit both;
a container backend turns them into device and cpuset options. Ports are held host-wide while a server
runs (`ports.reserved_port`), so jobs never share a port or a derived port.

A job ends with its harness. On SIGTERM or SIGINT the harness sends each job SIGTERM and waits for it: the
job stops its servers (every rank: their process group) and marks its cell interrupted. A job whose harness
was SIGKILLed gets the same SIGTERM from the kernel (PR_SET_PDEATHSIG). A server a dead job left behind is
reaped as soon as the job has ended (reaper.py); the runner records a cell a job never reached as a harness
error.

How long a job takes is estimated from the store: the job's last packed run; else the sum of its cells' last
served runs (an over-estimate where starts interleave, alike for every environment of a matrix); a job that
never ran is given the mean of the others (all equal when none ran: the order is then by GPU count). The
run's end states the makespan against its lower bound (`schedule.lower_bound`) and the store keeps its jobs.
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from rich.console import Console

from servematrix.backends import Backend
from servematrix.planning.cells import cell_bound
from servematrix.planning.plan import Plan
from servematrix.planning.schedule import (
    Job,
    Packer,
    Placement,
    Span,
    cpu_slices,
    makespan,
    makespan_line,
    placement,
    shared_cpus,
    simulate,
)
from servematrix.records.cell import Cell
from servematrix.run import hostinfo
from servematrix.run.progress import RunProgress
from servematrix.run.reaper import reap_orphans
from servematrix.run.runplan import RunOptions, Summary, gpu_ready
from servematrix.stages.bench_worker import format_cpus
from servematrix.store.store import Store

POLL_S = 0.2
JOB_PATH_ENV = "SERVEMATRIX_JOB_PATH"  # the harness's import path, for a job to import what it is handed
STOP_GRACE_S = 90.0  # a job stopping its servers (10 s each, a container's too) before it is killed


@dataclass(frozen=True, kw_only=True)
class PackedJob:
    """What a job's process is handed: its cells (by id, planned again from the matrix there), the run's options
    and backend, where it runs, and the harness it ends with."""

    matrix: Path
    cell_ids: tuple[str, ...]
    max_cells: int
    options: RunOptions
    backend: Backend
    placement: Placement | None  # None: a pre-flight job (run/pool.py), on no GPU and any CPU
    harness_pid: int
    relay: bool = False  # its progress as events for the harness to show (progress.relay_to)


@dataclass(kw_only=True)
class Packed:
    """A packed run's outcome: each job's span, and the verdicts its cells got."""

    host_gpus: int
    spans: list[Span] = field(default_factory=list)
    verdicts: dict[str, str] = field(default_factory=dict)  # cell id -> verdict (cells the jobs finished)
    failed: dict[str, str] = field(default_factory=dict)  # env id -> why its job died (an exit code, its log)
    reused: int = 0  # of those, cells whose published verdict a job reused
    owned: dict[str, int] = field(default_factory=dict)  # cell id -> pid of the live run a job left it to

    def add_to(self, summary: Summary) -> None:
        """The jobs' verdicts and counts into the run's summary."""
        summary.verdicts.update(self.verdicts)
        summary.reused += self.reused
        summary.skipped_owned.update(self.owned)

    def line(self) -> str:
        """The end summary's line: the makespan against its lower bound."""
        return makespan_line(self.spans, self.host_gpus)


def needs_gpus(cell: Cell) -> bool:
    kind = cell.env.gpu
    return kind.arch != "cpu" and kind.count > 0


def jobs_to_pack(plan: Plan, todo: Mapping[str, Sequence[Cell]]) -> dict[str, Sequence[Cell]]:
    """The environments of `todo` this run packs (env id -> its cells), or none: a host with several GPUs, all
    of the arch these environments need, and at least two environments that need them and have GPUs here."""
    host = hostinfo.host()
    wanted = {
        env_id: cells
        for env_id, cells in todo.items()
        if needs_gpus(cells[0]) and gpu_ready(cells[0].env) and any(c.applicable for c in cells)
    }
    if len(host.gpus) < 2 or len(wanted) < 2:
        return {}
    if any(host.count(cells[0].env.gpu.arch, cells[0].env.gpu.sku) != len(host.gpus) for cells in wanted.values()):
        return {}  # a host of mixed GPUs: one cell at a time, as before
    return wanted


def estimates(store: Store, envs: Mapping[str, Sequence[Cell]]) -> dict[str, float | None]:
    """How long each job is expected to take, from the store (see the module's doc), or None if it never ran."""
    packed = {job["env_id"]: job["end_s"] - job["start_s"] for job in store.packed_jobs() if job["end_s"] is not None}
    served: dict[str, float] = {}
    for row in store.latest():
        if "serve" in (row.stages or {}) and row.finished_at and row.started_at:
            took = datetime.fromisoformat(row.finished_at) - datetime.fromisoformat(row.started_at)
            served[row.cell_id] = took.total_seconds()
    found: dict[str, float | None] = {}
    for env_id, cells in envs.items():
        if env_id in packed:
            found[env_id] = packed[env_id]
        elif any(c.id in served for c in cells):
            found[env_id] = sum(served.get(c.id, 0.0) for c in cells)
        else:
            found[env_id] = None
    return found


def plan_jobs(envs: Mapping[str, Sequence[Cell]], known: Mapping[str, float | None]) -> list[Job]:
    """The jobs, each with its estimate; one never run gets the mean of the others, 1 s when none ran."""
    seen = [s for s in known.values() if s is not None]
    default = sum(seen) / len(seen) if seen else 1.0
    return [
        Job(key=env_id, gpus=cells[0].env.gpu.count, estimate_s=known.get(env_id) or default)
        for env_id, cells in envs.items()
    ]


@dataclass(kw_only=True)
class _Running:
    job: Job
    process: subprocess.Popen[bytes]
    placement: Placement
    start_s: float
    log: Path


def run_packed(
    plan: Plan,
    backend: Backend,
    options: RunOptions,
    envs: Mapping[str, Sequence[Cell]],
    *,
    store: Store,
    console: Console,
    progress: RunProgress,
) -> Packed:
    """Run the jobs, longest first, each on its GPUs as they free up; the store keeps where and when each ran.
    SIGINT/SIGTERM (KeyboardInterrupt) stops every job before it is raised again."""
    gpus = len(hostinfo.host().gpus)
    cpus = sorted(os.sched_getaffinity(0))
    slices = cpu_slices(cpus, gpus)
    known = estimates(store, envs)
    jobs = plan_jobs(envs, known)
    say = lambda text: print(f"servematrix: {text}", file=console.file, flush=True)  # noqa: E731
    estimated = sum(v is not None for v in known.values())
    predicted = simulate(jobs, gpus)
    say(
        f"packing {len(jobs)} environment(s) ({sum(len(c) for c in envs.values())} cell(s)) onto {gpus} GPUs, "
        f"longest first; {estimated} estimated from earlier runs"
        + (f", which predict a makespan of {makespan(predicted):.0f} s" if estimated else "")
    )
    if shared_cpus(cpus, gpus):
        say(f"this host has {len(cpus)} CPU(s) for {gpus} GPUs: jobs on different GPUs share CPUs")
    packer = Packer(jobs, gpus)
    outcome = Packed(host_gpus=gpus)
    free = set(range(gpus))
    running: list[_Running] = []
    began = time.monotonic()
    max_cells = sum(cell_bound(plan.spec))
    try:
        while packer.waiting or running:
            for job, chosen in packer.start(free):
                free -= set(chosen)
                where = placement(chosen, slices)
                cells = envs[job.key]
                log = options.workdir / "logs" / options.run_id / f"pack-{job.key}.log"
                handed = PackedJob(
                    matrix=plan.spec.path,
                    cell_ids=tuple(c.id for c in cells),
                    max_cells=max_cells,
                    options=options,
                    backend=backend,
                    placement=where,
                    harness_pid=os.getpid(),
                )
                start_s = time.monotonic() - began
                running.append(
                    _Running(job=job, process=_spawn(handed, log), placement=where, start_s=start_s, log=log)
                )
                store.record_packed_job(**_job_row(options.run_id, job, where, gpus, len(cells), start_s))
                say(f"{_where(where)}: env {job.key} ({len(cells)} cell(s)) started; log {log}")
            time.sleep(POLL_S)
            for done in [r for r in running if r.process.poll() is not None]:
                running.remove(done)
                free |= set(done.placement.gpus)
                end_s = time.monotonic() - began
                span = Span(job=done.job, gpus=done.placement.gpus, start_s=done.start_s, end_s=end_s)
                outcome.spans.append(span)
                store.record_packed_job(
                    **_job_row(options.run_id, done.job, done.placement, gpus, len(envs[done.job.key]), done.start_s),
                    end_s=end_s,
                )
                reap_orphans(store)  # what a job that died left running
                verdicts = finished_verdicts(store, options.run_id, envs[done.job.key])
                outcome.verdicts.update(verdicts)
                for cell in envs[done.job.key]:
                    if cell.id in verdicts:
                        progress.finished(cell, verdicts[cell.id])
                code = done.process.returncode
                if code:
                    outcome.failed[done.job.key] = f"its packed job's process exited {code}; its log: {done.log}"
                said = ", ".join(verdicts.values()) or "no verdict"
                say(
                    f"{_where(done.placement)}: env {done.job.key} done in {span.seconds:.1f} s ({said})"
                    + (f"; its process exited {code}, see {done.log}" if code else "")
                )
    except KeyboardInterrupt:
        _stop(running)
        reap_orphans(store)
        raise
    return outcome


def job_environment() -> dict[str, str]:
    """A job process's environment: this one's, and its import path in JOB_PATH_ENV (the backend is unpickled
    there: its class must import as it does here, a plugin or a test's fake). Not in PYTHONPATH: the servers and
    programs a job starts in an environment's own Python inherit it, and would read this Python's stdlib and
    packages."""
    return {**os.environ, JOB_PATH_ENV: os.pathsep.join(p or os.getcwd() for p in sys.path)}


def _spawn(job: PackedJob, log: Path) -> subprocess.Popen[bytes]:
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "servematrix.run.packjob"],
            stdin=subprocess.PIPE,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=job_environment(),
            # Its own session: a terminal's Ctrl-C reaches the harness alone, which stops each job once.
            start_new_session=True,
        )
    assert process.stdin is not None
    process.stdin.write(pickle.dumps(job))
    process.stdin.close()
    return process


def _stop(running: Sequence[_Running]) -> None:
    """SIGTERM every job, then wait for each to stop its servers; kill one that does not in time."""
    for job in running:
        if job.process.poll() is None:
            job.process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    for job in running:
        try:
            job.process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            job.process.kill()
            job.process.wait()


def finished_verdicts(store: Store, run_id: str, cells: Sequence[Cell]) -> dict[str, str]:
    wanted = {c.id for c in cells}
    return {
        r.cell_id: r.verdict
        for r in store.all_rows()
        if r.run_id == run_id and r.cell_id in wanted and r.status == "finished" and r.verdict is not None
    }


def _job_row(run_id: str, job: Job, where: Placement, host_gpus: int, cells: int, start_s: float) -> dict[str, object]:
    return {
        "run_id": run_id,
        "env_id": job.key,
        "host_gpus": host_gpus,
        "gpus": where.gpus,
        "cpus": where.cpus,
        "cells": cells,
        "estimate_s": job.estimate_s,
        "start_s": start_s,
    }


def _where(where: Placement) -> str:
    return f"gpus {','.join(map(str, where.gpus))} cpus {format_cpus(where.cpus)}"
