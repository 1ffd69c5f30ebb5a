"""Comparing a mode with the baseline: on the figures of the phase the mode changes, over its server starts
(each start's median of its repeats), with a 95 % t-interval (`interval.py` says why that rule), and a verdict:
faster, slower or indeterminate; for an indeterminate one, how many starts per mode would likely resolve a 10 %
effect, from the spread measured between starts.

A prefill feature (sglang's prefill CUDA graphs: piecewise, breakable) is judged on the prefill profile's time to
first token and input tok/s; a decode feature (continuous batching) on the decode profile's output tok/s. The
decode figures stand beside a prefill feature's, so a mode that costs decode speed shows it too.
"""

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from servematrix.stages.bench.interval import PLAN_EFFECT, start_interval, starts_needed
from servematrix.stages.bench.stats import BenchReport, Spread
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


VERDICTS = ("faster", "slower", "indeterminate")


@dataclass(frozen=True, kw_only=True)
class Speedup:
    """treatment over baseline on one metric at one concurrency, oriented so that > 1 is better (for TTFT it is
    baseline / treatment).

    ``ratio``: the geometric mean of the treatment's per-start medians over the baseline's. ``low``/``high``:
    its 95 % t-interval over per-start medians (`interval.start_interval`); NaN when a side has a single server
    start (no spread between starts to judge by). ``verdict``: "faster" when the interval lies above 1.0,
    "slower" below it, else "indeterminate" (``inconclusive``). ``starts_needed``: for an indeterminate figure,
    the server starts per mode that would likely (80 %) resolve an effect of ``plan_effect`` given the measured
    spread between starts (None: not measurable with one start a side, or more than 1000).
    """

    concurrency: int
    ratio: float
    low: float
    high: float
    verdict: str
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
    start_spread: float | None = None  # standard deviation of log per-start medians (pooled over both sides)
    starts_needed: int | None = None
    plan_effect: float = PLAN_EFFECT
    # Why the figure is not judged whatever its interval (the mode's output was not shown to match the baseline's:
    # a speed is judged only after the answers are right); "" when it is judged.
    unjudged: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def inconclusive(self) -> bool:
        return self.verdict == "indeterminate"

    @property
    def heading(self) -> str:
        """What the figure is, as a column heading says it: "TTFT @1, 1024 in"."""
        where = f", {self.input_len} in" if self.input_len else ""
        return f"{METRICS[self.metric].label} @{self.concurrency}{where}"

    @property
    def why_inconclusive(self) -> str:
        """Why the figure decides nothing ("" when it is decided)."""
        if not self.inconclusive:
            return ""
        if self.unjudged:
            return self.unjudged
        if min(self.baseline_starts, self.treatment_starts) < 2:
            return "one server start per mode"
        return "interval holds 1.0"

    @property
    def plan_text(self) -> str:
        """For an indeterminate figure with a measured spread: how many starts would likely resolve it."""
        if not self.inconclusive or self.start_spread is None or self.unjudged:
            return ""  # more starts cannot judge a mode whose answers were not checked
        effect = f"{self.plan_effect:.0%}"
        if self.starts_needed is None:
            return f"a {effect} effect needs more than 1000 starts per mode at this spread"
        more = max(0, self.starts_needed - min(self.baseline_starts, self.treatment_starts))
        return f"~{self.starts_needed} starts per mode ({more} more) would likely resolve a {effect} effect"

    @property
    def range_text(self) -> str:
        why = self.why_inconclusive
        if math.isnan(self.low):
            return f"indeterminate: {why}"
        text = f"{self.low:.2f}–{self.high:.2f}, " + (f"indeterminate: {why}" if why else self.verdict)
        plan = self.plan_text
        return f"{text}; {plan}" if plan else text

    def __str__(self) -> str:
        where = "no interval" if math.isnan(self.low) else f"{self.low:.3f}-{self.high:.3f}"
        return f"{self.ratio:.3f}x ({where}, {self.verdict}) at {self.concurrency} streams"


ReportLike = BenchReport | Mapping[str, Any]


def profile_record(report: ReportLike, profile: str) -> Mapping[str, Any] | None:
    """The stored report of one profile: the record itself for decode, its nested entry for another."""
    record = report.to_dict() if isinstance(report, BenchReport) else report
    if profile in NESTED_PROFILES:
        nested = record.get(profile)
        return nested if isinstance(nested, Mapping) else None
    return record if record.get("levels") else None


def _values(
    reports: ReportLike | Sequence[ReportLike], concurrency: int, metric: Metric
) -> tuple[list[float], list[list[float]]]:
    """Every repeat's figure at ``concurrency``, from one report or several (interleaved server starts), and
    the same figures grouped by the server start that measured them (a pooled record's runs name theirs)."""
    items: Iterable[ReportLike] = [reports] if isinstance(reports, BenchReport | Mapping) else reports
    values: list[float] = []
    starts: dict[tuple[int, object], list[float]] = {}
    for index, item in enumerate(items):
        record = profile_record(item, metric.profile) or {}
        for lv in record.get("levels", []):
            if lv.get("concurrency") == concurrency:
                for r in lv.get("runs", []):
                    if (v := metric.value(r)) is not None:
                        values.append(v)
                        starts.setdefault((index, r.get("start", 1)), []).append(v)
    return values, list(starts.values())


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
    plan_effect: float = PLAN_EFFECT,
) -> Speedup:
    """Speedup of ``treatment`` over ``baseline`` on ``metric`` at ``concurrency``, judged over server starts
    (`interval.start_interval`). Each side is a :class:`BenchReport`, its ``to_dict()`` (as stored), or a list
    of them (one per server start)."""
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
    better, worse = (treat_starts, base_starts) if which.higher_is_better else (base_starts, treat_starts)
    found = start_interval(better, worse)
    if found.low is None or found.high is None:
        low = high = math.nan
        verdict = "indeterminate"
    else:
        low, high = found.low, found.high
        verdict = "faster" if low > 1.0 else "slower" if high < 1.0 else "indeterminate"
    needed = None
    if verdict == "indeterminate" and found.spread is not None:
        needed = starts_needed(found.spread, plan_effect)
    first = baseline if isinstance(baseline, BenchReport | Mapping) else baseline[0]
    return Speedup(
        concurrency=concurrency,
        ratio=found.ratio,
        low=low,
        high=high,
        verdict=verdict,
        method="t-interval over per-start medians",
        baseline=Spread.of(base),
        treatment=Spread.of(treat),
        baseline_repeats=len(base),
        treatment_repeats=len(treat),
        metric=metric,
        profile=which.profile,
        input_len=input_len(first, which.profile) if which.profile != "decode" else None,
        baseline_starts=len(base_starts),
        treatment_starts=len(treat_starts),
        start_spread=found.spread,
        starts_needed=needed,
        plan_effect=plan_effect,
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


def compare(baseline: ReportLike, treatment: ReportLike, phase: str, *, unjudged: str = "") -> ModeComparison:
    """``treatment`` (a mode that changes ``phase``) against ``baseline``, from their stored records.
    ``unjudged``: why no figure may be called faster or slower (its output was not shown to match the
    baseline's); every figure is then indeterminate, with that reason, its ratio and interval still shown."""
    metrics = PHASE_METRICS.get(phase)
    if metrics is None:
        raise ValueError(f"compare: phase must be one of {', '.join(PHASE_METRICS)}, got {phase!r}")
    judged = tuple(s for metric in metrics for s in _speedups(baseline, treatment, metric))
    decode = () if phase == "decode" else _speedups(baseline, treatment, "output_tok_s")
    if unjudged:
        judged, decode = (
            tuple(replace(s, verdict="indeterminate", unjudged=unjudged, starts_needed=None) for s in figures)
            for figures in (judged, decode)
        )
    return ModeComparison(phase=phase, judged=judged, decode=decode)
