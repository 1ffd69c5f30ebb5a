"""Where and when each job of a packed run runs on a host's GPUs: pure functions, no processes.

A job is one environment's cells: they share its build and interleave their server starts, so they run in
turn on one set of GPUs, the GPU kind's count. Jobs on disjoint GPU sets run at the same time, each with the
CPUs of its GPUs (`cpu_slices`). The order is longest first (LPT): each time GPUs free up, the longest job
still waiting that fits on the free GPUs starts there (`Packer`). A job's length is an estimate (`run/packing.py`
says from what); the makespan is judged against its lower bound, max(total GPU-seconds / GPUs, longest
job), from the lengths measured (`lower_bound`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence, Set
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, kw_only=True)
class Job:
    key: str  # the environment's id
    gpus: int  # how many GPUs it needs, all of them at once
    estimate_s: float  # how long it is expected to hold them


@dataclass(frozen=True, kw_only=True)
class Placement:
    """Where a job runs: its GPUs (indices on this host) and the CPUs that go with them."""

    gpus: tuple[int, ...]
    cpus: tuple[int, ...]


@dataclass(frozen=True, kw_only=True)
class Span:
    """A job as it ran (or would run): on which GPUs, from when to when, in seconds since the pack began."""

    job: Job
    gpus: tuple[int, ...]
    start_s: float
    end_s: float

    @property
    def seconds(self) -> float:
        return self.end_s - self.start_s


def longest_first(jobs: Iterable[Job]) -> list[Job]:
    """LPT order: the longest first; among equals, the one needing more GPUs (harder to fit later)."""
    return sorted(jobs, key=lambda job: (-job.estimate_s, -job.gpus, job.key))


def choose_gpus(free: Set[int], count: int) -> tuple[int, ...] | None:
    """`count` of the `free` GPUs, or None if too few are free. An aligned block (0-1, 2-3; 0-3, 4-7) when one
    is free: GPUs are linked in such blocks on most hosts, and it leaves the other blocks whole."""
    if count > len(free):
        return None
    if count > 0:
        top = max(free) + 1
        for first in range(0, top, count):
            block = tuple(range(first, first + count))
            if set(block) <= free:
                return block
    return tuple(sorted(free)[:count])


@dataclass
class Packer:
    """The jobs still waiting, longest first, started as GPUs free up (`start`)."""

    jobs: Sequence[Job]
    gpus: int  # the host's GPUs: 0 .. gpus-1
    waiting: list[Job] = field(init=False)

    def __post_init__(self) -> None:
        too_big = [job for job in self.jobs if job.gpus > self.gpus]
        if too_big:
            raise ValueError(f"{too_big[0].key} needs {too_big[0].gpus} GPUs; this host has {self.gpus}")
        self.waiting = longest_first(self.jobs)

    def start(self, free: Set[int]) -> list[tuple[Job, tuple[int, ...]]]:
        """The waiting jobs that start now on the `free` GPUs, each with its GPUs: in LPT order, every job that
        still fits (a shorter one may start beside a longer one that waits for more GPUs)."""
        left = set(free)
        started: list[tuple[Job, tuple[int, ...]]] = []
        for job in list(self.waiting):
            chosen = choose_gpus(left, job.gpus)
            if chosen is None:
                continue
            left -= set(chosen)
            self.waiting.remove(job)
            started.append((job, chosen))
        return started


def simulate(jobs: Sequence[Job], gpus: int) -> list[Span]:
    """The packed schedule the estimates predict: what `Packer` does when every job takes its estimate."""
    packer = Packer(jobs, gpus)
    free = set(range(gpus))
    now = 0.0
    running: list[Span] = []
    done: list[Span] = []
    while packer.waiting or running:
        for job, chosen in packer.start(free):
            free -= set(chosen)
            running.append(Span(job=job, gpus=chosen, start_s=now, end_s=now + job.estimate_s))
        if not running:
            break  # nothing fits: cannot happen, Packer refuses a job larger than the host
        finished = min(running, key=lambda span: span.end_s)
        running.remove(finished)
        done.append(finished)
        free |= set(finished.gpus)
        now = finished.end_s
    return done


def makespan(spans: Iterable[Span]) -> float:
    return max((span.end_s for span in spans), default=0.0)


def lower_bound(spans: Iterable[Span], gpus: int) -> float:
    """No schedule of these jobs on `gpus` GPUs ends sooner: max(total GPU-seconds / GPUs, longest job)."""
    spans = list(spans)
    if not spans:
        return 0.0
    area = sum(span.job.gpus * span.seconds for span in spans)
    return max(area / gpus, max(span.seconds for span in spans))


def makespan_line(spans: Sequence[Span], gpus: int) -> str:
    """`packed 5 job(s) on 4 GPUs: makespan 41.2 s, lower bound 38.0 s (1.08x) ...; the jobs' times summed: 95.3 s`."""
    end = makespan(spans)
    bound = lower_bound(spans, gpus)
    ratio = f" ({end / bound:.2f}x)" if bound > 0 else ""
    return (
        f"packed {len(spans)} job(s) on {gpus} GPUs: makespan {end:.1f} s, lower bound {bound:.1f} s{ratio} "
        f"(max of GPU-seconds / {gpus} and the longest job); the jobs' times summed: {sum(s.seconds for s in spans):.1f} s"
    )


def stored_spans(jobs: Iterable[Mapping[str, Any]]) -> list[Span]:
    """The finished jobs of a packed run as the store keeps them (`Store.packed_jobs`)."""
    return [
        Span(
            job=Job(key=job["env_id"], gpus=len(job["gpus"]), estimate_s=job["estimate_s"] or 0.0),
            gpus=tuple(job["gpus"]),
            start_s=job["start_s"],
            end_s=job["end_s"],
        )
        for job in jobs
        if job["end_s"] is not None
    ]


def cpu_slices(cpus: Sequence[int], gpus: int) -> list[tuple[int, ...]]:
    """Each GPU's CPUs: the host's CPUs in contiguous, near-equal slices, one per GPU, disjoint. A host with
    fewer CPUs than GPUs cannot give each its own: GPUs then share CPUs, in turn (`shared_cpus` says so)."""
    ordered = sorted(cpus)
    if not ordered or gpus < 1:
        return [() for _ in range(max(gpus, 0))]
    if len(ordered) < gpus:
        return [(ordered[g * len(ordered) // gpus],) for g in range(gpus)]
    return [tuple(ordered[g * len(ordered) // gpus : (g + 1) * len(ordered) // gpus]) for g in range(gpus)]


def shared_cpus(cpus: Sequence[int], gpus: int) -> bool:
    """Whether the GPUs must share CPUs: fewer CPUs than GPUs."""
    return len(set(cpus)) < gpus


def placement(gpus: tuple[int, ...], slices: Sequence[tuple[int, ...]]) -> Placement:
    """A job on `gpus`: those GPUs and their CPUs."""
    return Placement(gpus=gpus, cpus=tuple(sorted({cpu for g in gpus for cpu in slices[g]})))
