"""Comparing a mode with the baseline: on the figures of the phase the mode changes, pooled over every repeat of
every server start, with a range, and "inconclusive" when that range holds 1.0.

A prefill feature (sglang's prefill CUDA graphs: piecewise, breakable) is judged on the prefill profile's time to
first token and input tok/s; a decode feature (continuous batching) on the decode profile's output tok/s. The
decode figures stand beside a prefill feature's, so a mode that costs decode speed shows it too.
"""

import random
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from servematrix.stages.bench.stats import BenchReport, Spread, percentile
from servematrix.stages.bench.workload import NESTED_PROFILES


@dataclass(frozen=True, kw_only=True)
class Metric:
    """A figure of one repeat, as stored, and which way is better."""

    name: str
    profile: str
    label: str  # as a column heading shows it
    higher_is_better: bool

    def value(self, run: Mapping[str, Any]) -> float | None:
        if self.name == "ttft":
            mean = (run.get("ttft") or {}).get("mean")
            return float(mean) if isinstance(mean, int | float) and mean > 0 else None
        if self.name == "input_tok_s" and "input_tok_s" not in run:  # stored before the field existed
            wall, tokens = run.get("wall_s") or 0, run.get("prompt_tokens") or 0
            return tokens / wall if wall > 0 and tokens > 0 else None
        value = run.get(self.name)
        return float(value) if isinstance(value, int | float) and value > 0 else None


METRICS = {
    "ttft": Metric(name="ttft", profile="prefill", label="TTFT", higher_is_better=False),
    "input_tok_s": Metric(name="input_tok_s", profile="prefill", label="prefill tok/s", higher_is_better=True),
    "output_tok_s": Metric(name="output_tok_s", profile="decode", label="decode tok/s", higher_is_better=True),
}
# The metrics that judge a mode, by the phase its engine data says it changes; the first is the headline.
PHASE_METRICS = {"prefill": ("ttft", "input_tok_s"), "decode": ("output_tok_s",)}


@dataclass(frozen=True, kw_only=True)
class Speedup:
    """treatment over baseline on one metric at one concurrency: the ratio of medians (oriented so that > 1 is
    better: for TTFT it is baseline / treatment) and its range.

    ``low``/``high`` with method "pairs": the smallest and largest ratio of any (treatment repeat, baseline
    repeat) pair; with "bootstrap": the 2.5th and 97.5th percentiles of the ratio of medians over resamples of
    the repeats (fixed seed). ``inconclusive``: the range includes 1.0, or a side has a single repeat or a
    single server start (no spread to judge by).
    """

    concurrency: int
    ratio: float
    low: float
    high: float
    inconclusive: bool
    method: str
    baseline: Spread
    treatment: Spread
    baseline_repeats: int
    treatment_repeats: int
    metric: str = "output_tok_s"
    profile: str = "decode"
    input_len: int | None = None
    baseline_starts: int = 1
    treatment_starts: int = 1

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def heading(self) -> str:
        """What the figure is, as a column heading says it: "TTFT @1, 1024 in"."""
        where = f", {self.input_len} in" if self.input_len else ""
        return f"{METRICS[self.metric].label} @{self.concurrency}{where}"

    @property
    def why_inconclusive(self) -> str:
        """Why the figure decides nothing ("" when it is conclusive)."""
        if not self.inconclusive:
            return ""
        if min(self.baseline_repeats, self.treatment_repeats) < 2:
            return "one repeat"
        if self.low <= 1.0 <= self.high:
            return "range holds 1.0"
        return "one server start per mode"

    @property
    def range_text(self) -> str:
        why = self.why_inconclusive
        return f"{self.low:.2f}–{self.high:.2f}, " + (f"inconclusive: {why}" if why else "conclusive")

    def __str__(self) -> str:
        verdict = "inconclusive" if self.inconclusive else "conclusive"
        return f"{self.ratio:.3f}x ({self.low:.3f}-{self.high:.3f}, {verdict}) at {self.concurrency} streams"


ReportLike = BenchReport | Mapping[str, Any]


def profile_record(report: ReportLike, profile: str) -> Mapping[str, Any] | None:
    """The stored report of one profile: the record itself for decode, its nested entry for another."""
    record = report.to_dict() if isinstance(report, BenchReport) else report
    if profile in NESTED_PROFILES:
        nested = record.get(profile)
        return nested if isinstance(nested, Mapping) else None
    return record if record.get("levels") else None


def _values(reports: ReportLike | Sequence[ReportLike], concurrency: int, metric: Metric) -> tuple[list[float], int]:
    """Every repeat's figure at ``concurrency``, from one report or several (interleaved server starts), and
    how many server starts they came from (a pooled record's runs name theirs)."""
    items: Iterable[ReportLike] = [reports] if isinstance(reports, BenchReport | Mapping) else reports
    values: list[float] = []
    starts: set[tuple[int, object]] = set()
    for index, item in enumerate(items):
        record = profile_record(item, metric.profile) or {}
        for lv in record.get("levels", []):
            if lv.get("concurrency") == concurrency:
                for r in lv.get("runs", []):
                    if (v := metric.value(r)) is not None:
                        values.append(v)
                        starts.add((index, r.get("start", 1)))
    return values, len(starts)


def concurrencies(report: ReportLike, profile: str) -> list[int]:
    """The levels a profile's record measured, in order."""
    record = profile_record(report, profile) or {}
    return sorted({int(lv["concurrency"]) for lv in record.get("levels", []) if lv.get("runs")})


def input_len(report: ReportLike, profile: str) -> int | None:
    record = profile_record(report, profile) or {}
    value = (record.get("workload") or {}).get("input_len")
    return int(value) if isinstance(value, int) else None


def speedup(
    baseline: ReportLike | Sequence[ReportLike],
    treatment: ReportLike | Sequence[ReportLike],
    concurrency: int,
    *,
    metric: str = "output_tok_s",
    method: str = "pairs",
    resamples: int = 2000,
    seed: int = 0,
) -> Speedup:
    """Speedup of ``treatment`` over ``baseline`` on ``metric`` at ``concurrency``. Each side is a
    :class:`BenchReport`, its ``to_dict()`` (as stored), or a list of them (one per server start): their
    repeats are pooled."""
    which = METRICS.get(metric)
    if which is None:
        raise ValueError(f"speedup: metric must be one of {', '.join(METRICS)}, got {metric!r}")
    (base, base_starts), (treat, treat_starts) = (
        _values(baseline, concurrency, which),
        _values(treatment, concurrency, which),
    )
    for name, values in (("baseline", base), ("treatment", treat)):
        if not values:
            raise ValueError(f"speedup: the {name} has no repeat with {which.label} at {concurrency} streams")
    # Oriented so that > 1 means the treatment is better: for a time, baseline over treatment.
    better, worse = (treat, base) if which.higher_is_better else (base, treat)
    ratio = statistics.median(better) / statistics.median(worse)
    if method == "pairs":
        low, high = min(better) / max(worse), max(better) / min(worse)
    elif method == "bootstrap":
        rng = random.Random(seed)
        ratios = sorted(
            statistics.median(rng.choices(better, k=len(better))) / statistics.median(rng.choices(worse, k=len(worse)))
            for _ in range(resamples)
        )
        low, high = percentile(ratios, 2.5), percentile(ratios, 97.5)
    else:
        raise ValueError(f"speedup: method must be 'pairs' or 'bootstrap', got {method!r}")
    # One server start per side measures no spread between starts, which on the H200 was as large as the
    # effects compared (about 20 %): such a figure is shown, never called conclusive.
    single = len(base) < 2 or len(treat) < 2 or base_starts < 2 or treat_starts < 2
    first = baseline if isinstance(baseline, BenchReport | Mapping) else baseline[0]
    return Speedup(
        concurrency=concurrency,
        ratio=ratio,
        low=low,
        high=high,
        inconclusive=single or low <= 1.0 <= high,
        method=method,
        baseline=Spread.of(base),
        treatment=Spread.of(treat),
        baseline_repeats=len(base),
        treatment_repeats=len(treat),
        metric=metric,
        profile=which.profile,
        input_len=input_len(first, which.profile) if which.profile != "decode" else None,
        baseline_starts=base_starts,
        treatment_starts=treat_starts,
    )


@dataclass(frozen=True, kw_only=True)
class ModeComparison:
    """A mode against the baseline: ``judged`` on the metrics of the phase it changes, at every level both
    measured; ``decode`` beside them for a mode of another phase.

    The headline: for a prefill mode its first metric (TTFT) at the lowest level, where launch overhead is
    largest; for a decode mode output tok/s at the highest level, where batching shows. Every other figure is
    shown beside it, so a mode that is slower somewhere (continuous batching at one stream) cannot hide."""

    phase: str
    judged: tuple[Speedup, ...]
    decode: tuple[Speedup, ...] = ()

    @property
    def headline(self) -> Speedup | None:
        if not self.judged:
            return None
        return max(self.judged, key=lambda s: s.concurrency) if self.phase == "decode" else self.judged[0]

    @property
    def others(self) -> tuple[Speedup, ...]:
        """Every figure but the headline: the phase's other metrics and levels, then the decode figures."""
        return tuple(s for s in (*self.judged, *self.decode) if s is not self.headline)


def _speedups(baseline: ReportLike, treatment: ReportLike, metric: str) -> tuple[Speedup, ...]:
    profile = METRICS[metric].profile
    common = sorted(set(concurrencies(baseline, profile)) & set(concurrencies(treatment, profile)))
    found = []
    for c in common:
        try:
            found.append(speedup(baseline, treatment, c, metric=metric))
        except ValueError:  # a level whose repeats hold no such figure (every request failed)
            continue
    return tuple(found)


def compare(baseline: ReportLike, treatment: ReportLike, phase: str) -> ModeComparison:
    """``treatment`` (a mode that changes ``phase``) against ``baseline``, from their stored records."""
    metrics = PHASE_METRICS.get(phase)
    if metrics is None:
        raise ValueError(f"compare: phase must be one of {', '.join(PHASE_METRICS)}, got {phase!r}")
    judged = tuple(s for metric in metrics for s in _speedups(baseline, treatment, metric))
    decode = () if phase == "decode" else _speedups(baseline, treatment, "output_tok_s")
    return ModeComparison(phase=phase, judged=judged, decode=decode)
