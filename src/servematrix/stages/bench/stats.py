"""The figures of a benchmark: one repeat (LevelRun), one level over its repeats (LevelSummary), one run
(BenchReport), and the client's ceiling beside them."""

import dataclasses
import math
import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

from servematrix.stages.bench.workload import NESTED_PROFILES, Workload
from servematrix.stages.bench_worker import (
    RequestResult,
)

MAX_ERROR_SAMPLES = 5
# A level is flagged client_bound when its best repeat reaches this fraction of the client's ceiling (under 3x
# headroom, the client's own cost and jitter show in the figure), or when the client's processes were busy this
# fraction of the time or more while it ran. The second rule is the one that counts with a real server: events
# then arrive one or a few per network read, which costs the client several times more CPU per token than the
# bursts of the fake server at full speed (measured: 40 us vs 5 us per token on a 2-core EPYC VM).
CLIENT_BOUND_FRACTION = 1 / 3


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default method), q in [0, 100]."""
    if not values:
        raise ValueError("percentile of an empty sequence")
    s = sorted(values)
    pos = (len(s) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


@dataclass(frozen=True)
class LatencyStats:
    """Seconds. ``count`` is the number of samples (requests, or gaps for ITL)."""

    count: int
    mean: float | None
    p50: float | None
    p99: float | None

    @classmethod
    def of(cls, values: Sequence[float]) -> "LatencyStats":
        if not values:
            return cls(0, None, None, None)
        return cls(len(values), statistics.fmean(values), percentile(values, 50), percentile(values, 99))


@dataclass(frozen=True)
class LevelRun:
    """One repeat of one concurrency level.

    ``client_cpu_s`` is the client's CPU time (user+sys, summed over its worker processes) during the repeat;
    ``client_busy`` that time over ``wall_s`` x ``client_processes``: near 1, the client's processes were
    saturated while the figure was measured.
    """

    concurrency: int
    repeat: int
    num_requests: int
    completed: int
    error_count: int
    errors: dict[str, int]
    error_samples: list[str]
    wall_s: float
    completion_tokens: int  # sum of usage.completion_tokens over completed requests
    prompt_tokens: int
    output_tok_s: float
    request_s: float
    ttft: LatencyStats
    itl: LatencyStats
    e2e: LatencyStats
    client_cpu_s: float | None = None
    client_processes: int = 1
    client_busy: float | None = None
    # Prompt tokens (usage.prompt_tokens) over wall_s: the prefill profile's throughput figure.
    input_tok_s: float = 0.0
    start: int = 1  # which server start of the cell measured it (several when starts are pooled)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "LevelRun":
        """A repeat as stored (`asdict`); fields a row stored before they existed keep their defaults."""
        names = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in names}
        for latency in ("ttft", "itl", "e2e"):
            values[latency] = LatencyStats(**data[latency])
        if "input_tok_s" not in data and data.get("wall_s"):
            values["input_tok_s"] = (data.get("prompt_tokens") or 0) / data["wall_s"]
        return cls(**values)

    @classmethod
    def aggregate(
        cls,
        concurrency: int,
        repeat: int,
        results: Sequence[RequestResult],
        wall_s: float,
        *,
        client_cpu_s: float | None = None,
        client_processes: int = 1,
    ) -> "LevelRun":
        ok = [r for r in results if r.ok]
        bad = [r for r in results if not r.ok]
        completion = sum(r.completion_tokens or 0 for r in ok)
        samples = [f"{r.error}: {r.error_detail}" for r in bad[:MAX_ERROR_SAMPLES]]
        busy = client_cpu_s / (wall_s * client_processes) if client_cpu_s is not None and wall_s > 0 else None
        return cls(
            concurrency=concurrency,
            repeat=repeat,
            num_requests=len(results),
            completed=len(ok),
            error_count=len(bad),
            errors=dict(Counter(r.error or "unknown" for r in bad)),
            error_samples=samples,
            wall_s=wall_s,
            completion_tokens=completion,
            prompt_tokens=sum(r.prompt_tokens or 0 for r in ok),
            output_tok_s=completion / wall_s if wall_s > 0 else 0.0,
            input_tok_s=sum(r.prompt_tokens or 0 for r in ok) / wall_s if wall_s > 0 else 0.0,
            request_s=len(ok) / wall_s if wall_s > 0 else 0.0,
            ttft=LatencyStats.of([r.ttft_s for r in ok if r.ttft_s is not None]),
            itl=LatencyStats.of([gap for r in ok for gap in r.itl_s]),
            e2e=LatencyStats.of([r.e2e_s for r in ok if r.e2e_s is not None]),
            client_cpu_s=client_cpu_s,
            client_processes=client_processes,
            client_busy=busy,
        )


# Warm-up until stable: a level whose repeats drift by more than this (first half against second half) is
# warmed up further, one repeat at a time, up to MAX_WARMUP_REPEATS (the 0.5.12 baseline's TTFT @4 fell from
# 53.6 to 29.8 ms over six repeats on the H200, and nothing noticed).
DRIFT_BOUND = 0.10
MAX_WARMUP_REPEATS = 3


def level_figure(run: "LevelRun", profile: str) -> float | None:
    """The figure a level's stability is judged on: mean TTFT for the prefill profile, output tok/s else."""
    if profile == "prefill":
        return run.ttft.mean
    return run.output_tok_s or None


def drift(values: Sequence[float], bound: float = DRIFT_BOUND) -> dict[str, Any]:
    """First half against second half of a level's repeats (in order; the middle one left out when odd):
    ``drifting`` when their medians differ by more than ``bound`` (relative to the first half) and their ranges
    do not overlap (a trend, not one outlier); None with fewer than two repeats."""
    h = len(values) // 2
    if h < 1:
        return {"first": None, "second": None, "change": None, "drifting": None, "bound": bound}
    first, second = values[:h], values[-h:]
    a, b = statistics.median(first), statistics.median(second)
    change = (b - a) / a if a else 0.0
    apart = max(first) < min(second) or min(first) > max(second)
    return {"first": a, "second": b, "change": change, "drifting": abs(change) > bound and apart, "bound": bound}


@dataclass(frozen=True)
class Spread:
    min: float
    median: float
    max: float

    @classmethod
    def of(cls, values: Sequence[float]) -> "Spread":
        return cls(min(values), statistics.median(values), max(values))


@dataclass(frozen=True, kw_only=True)
class CeilingLevel:
    """The client's ceiling at one concurrency: its best repeat against the fake server (no per-token delay)."""

    concurrency: int
    tok_s: float
    cpu_s_per_1k_tokens: float | None
    client_busy: float | None


@dataclass(frozen=True, kw_only=True)
class Ceiling:
    """What the client can do on this host, measured by :func:`measure_ceiling`."""

    levels: tuple[CeilingLevel, ...]
    client_processes: int
    client_cpus: tuple[int, ...]
    server_cpus: tuple[int, ...]  # where the fake server ran
    fake_processes: int
    api: str
    output_len: int
    measured_at: float  # Unix time

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Ceiling":
        values = dict(data)
        values["levels"] = tuple(CeilingLevel(**level) for level in data["levels"])
        values["client_cpus"] = tuple(data["client_cpus"])
        values["server_cpus"] = tuple(data["server_cpus"])
        return cls(**values)

    def tok_s(self, concurrency: int) -> float | None:
        return next((lv.tok_s for lv in self.levels if lv.concurrency == concurrency), None)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class LevelSummary:
    """All repeats of one concurrency level, and the client's figures beside them.

    ``client_ceiling_tok_s``: the client's ceiling at this concurrency (None if not measured);
    ``client_headroom``: that ceiling over the best repeat; ``client_busy``: the highest fraction of time the
    client's processes were busy in a repeat; ``client_bound``: the best repeat reached ``CLIENT_BOUND_FRACTION``
    of the ceiling, or ``client_busy`` reached it (None if neither was measured).
    """

    concurrency: int
    runs: list[LevelRun]
    warmup_requests: int
    warmup_errors: dict[str, int]
    output_tok_s: Spread
    request_s: Spread
    error_count: int
    completion_tokens: int
    calibration_requests: int = 0  # requests of repeats discarded for ending under min_level_s
    min_level_s: float = 0.0
    floor_met: bool = True
    wall_s: Spread | None = None
    client_cpu_s: Spread | None = None
    client_cpu_s_per_1k_tokens: float | None = None
    client_ceiling_tok_s: float | None = None
    client_headroom: float | None = None
    client_busy: float | None = None
    client_bound: bool | None = None
    input_tok_s: Spread | None = None
    ttft_mean_s: Spread | None = None  # each repeat's mean time to first token
    # Warm-up until stable: repeats discarded because the level's figure still drifted (counted as warm-up),
    # and per server start what was found: the figure judged, the discarded repeats' values, the final
    # first-half/second-half medians, their relative change and whether it stayed past the bound.
    warmup_repeats: int = 0
    stability: tuple[dict[str, Any], ...] = ()

    @classmethod
    def of(
        cls,
        concurrency: int,
        runs: list[LevelRun],
        *,
        warmup: Sequence[RequestResult] = (),
        calibration_requests: int = 0,
        min_level_s: float = 0.0,
        ceiling_tok_s: float | None = None,
        warmup_repeats: int = 0,
        stability: Sequence[Mapping[str, Any]] = (),
    ) -> "LevelSummary":
        cpu = [r.client_cpu_s for r in runs if r.client_cpu_s is not None]
        tokens = sum(r.completion_tokens for r in runs)
        best = max(r.output_tok_s for r in runs)
        ttft = [r.ttft.mean for r in runs if r.ttft.mean is not None]
        busy = max((r.client_busy for r in runs if r.client_busy is not None), default=None)
        near_ceiling = None if ceiling_tok_s is None else best >= ceiling_tok_s * CLIENT_BOUND_FRACTION
        saturated = None if busy is None else busy >= CLIENT_BOUND_FRACTION
        return cls(
            concurrency=concurrency,
            runs=runs,
            warmup_requests=len(warmup),
            warmup_errors=dict(Counter(r.error or "unknown" for r in warmup if not r.ok)),
            output_tok_s=Spread.of([r.output_tok_s for r in runs]),
            request_s=Spread.of([r.request_s for r in runs]),
            error_count=sum(r.error_count for r in runs),
            completion_tokens=tokens,
            calibration_requests=calibration_requests,
            min_level_s=min_level_s,
            floor_met=all(r.wall_s >= min_level_s for r in runs),
            wall_s=Spread.of([r.wall_s for r in runs]),
            client_cpu_s=Spread.of(cpu) if cpu else None,
            client_cpu_s_per_1k_tokens=sum(cpu) / tokens * 1000 if cpu and tokens else None,
            client_ceiling_tok_s=ceiling_tok_s,
            client_headroom=ceiling_tok_s / best if ceiling_tok_s is not None and best > 0 else None,
            client_busy=busy,
            client_bound=None if near_ceiling is None and saturated is None else bool(near_ceiling or saturated),
            input_tok_s=Spread.of([r.input_tok_s for r in runs]),
            ttft_mean_s=Spread.of(ttft) if ttft else None,
            warmup_repeats=warmup_repeats,
            stability=tuple(dict(item) for item in stability),
        )

    @classmethod
    def pooled(cls, starts: Sequence["LevelSummary"]) -> "LevelSummary":
        """One level over several server starts of a cell: every figure is the aggregation of all their
        repeats (each run keeps its start), computed by :meth:`of` as for one start."""
        runs = [dataclasses.replace(run, start=i) for i, level in enumerate(starts, 1) for run in level.runs]
        first = starts[0]
        level = cls.of(
            first.concurrency,
            runs,
            calibration_requests=sum(lv.calibration_requests for lv in starts),
            min_level_s=first.min_level_s,
            ceiling_tok_s=first.client_ceiling_tok_s,
            warmup_repeats=sum(lv.warmup_repeats for lv in starts),
            stability=[item for lv in starts for item in lv.stability],
        )
        warmup_errors: Counter[str] = Counter()
        for lv in starts:
            warmup_errors.update(lv.warmup_errors)
        return dataclasses.replace(
            level, warmup_requests=sum(lv.warmup_requests for lv in starts), warmup_errors=dict(warmup_errors)
        )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "LevelSummary":
        """A level as stored: its figures recomputed from its runs (the one aggregation), its warmup and
        calibration counts as stored."""
        level = cls.of(
            data["concurrency"],
            [LevelRun.from_dict(run) for run in data["runs"]],
            calibration_requests=data.get("calibration_requests", 0),
            min_level_s=data.get("min_level_s", 0.0),
            ceiling_tok_s=data.get("client_ceiling_tok_s"),
            warmup_repeats=data.get("warmup_repeats", 0),
            stability=data.get("stability") or (),
        )
        return dataclasses.replace(
            level, warmup_requests=data.get("warmup_requests", 0), warmup_errors=dict(data.get("warmup_errors", {}))
        )


@dataclass(frozen=True)
class BenchReport:
    base_url: str
    model: str
    workload: Workload
    levels: list[LevelSummary]
    started_at: float  # Unix time
    duration_s: float
    client: dict[str, Any]
    client_ceiling: Ceiling | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "BenchReport":
        """A report as stored by :meth:`to_dict`."""
        names = {f.name for f in fields(Workload)}
        work = {k: v for k, v in data["workload"].items() if k in names}
        work["concurrency"] = tuple(work["concurrency"])
        work["client_cpus"] = tuple(work.get("client_cpus", ()))
        ceiling = data.get("client_ceiling")
        return cls(
            base_url=data["base_url"],
            model=data["model"],
            workload=Workload(**work),
            levels=[LevelSummary.from_dict(level) for level in data["levels"]],
            started_at=data["started_at"],
            duration_s=data["duration_s"],
            client=dict(data.get("client", {})),
            client_ceiling=Ceiling.from_dict(ceiling) if ceiling else None,
        )

    def level(self, concurrency: int) -> LevelSummary | None:
        return next((lv for lv in self.levels if lv.concurrency == concurrency), None)

    def output_tok_s(self, concurrency: int) -> float | None:
        """Median output tokens/s across repeats at ``concurrency``, or None if that level was not run."""
        lv = self.level(concurrency)
        return lv.output_tok_s.median if lv else None

    @property
    def error_count(self) -> int:
        return sum(lv.error_count for lv in self.levels)

    @property
    def completion_tokens(self) -> int:
        return sum(lv.completion_tokens for lv in self.levels)

    @property
    def client_bound(self) -> bool:
        """True if any level came within reach of the client's ceiling."""
        return any(lv.client_bound for lv in self.levels)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["workload"]["concurrency"] = list(self.workload.concurrency)
        d["workload"]["client_cpus"] = list(self.workload.client_cpus)
        d["error_count"] = self.error_count
        d["completion_tokens"] = self.completion_tokens
        d["client_bound"] = self.client_bound
        return d


def pool_starts(reports: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """One benchmark record from the reports of a cell's server starts (as stored): each level the
    aggregation of all their repeats (:meth:`LevelSummary.pooled`), the run's duration their sum; the
    profiles a record holds besides the decode one (`prefill`) pooled the same way."""
    if not reports:
        return None
    if len(reports) == 1:
        return dict(reports[0])
    parsed = [BenchReport.from_dict(r) for r in reports]
    first = parsed[0]
    levels = [
        LevelSummary.pooled([lv for report in parsed if (lv := report.level(level.concurrency)) is not None])
        for level in first.levels
    ]
    pooled = dataclasses.replace(first, levels=levels, duration_s=sum(r.duration_s for r in parsed)).to_dict()
    pooled["starts"] = len(reports)
    # Each start's graph capture times (the start-up cost of the mode), in the order of the starts.
    pooled["capture_s_by_start"] = [r.get("capture_s") for r in reports]
    for key, value in reports[0].items():
        if key in NESTED_PROFILES:
            pooled[key] = pool_starts([r[key] for r in reports if r.get(key)])
        elif key not in pooled:
            pooled[key] = value
    return pooled
