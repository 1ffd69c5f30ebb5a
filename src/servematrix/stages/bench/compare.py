"""Comparing two modes: the ratio of medians of a metric over every repeat of every start, and its range."""

import random
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from servematrix.stages.bench.stats import BenchReport, Spread, percentile


@dataclass(frozen=True, kw_only=True)
class Speedup:
    """treatment/baseline output tok/s at one concurrency: the ratio of medians and its range.

    ``low``/``high`` with method "pairs": the smallest and largest ratio of any (treatment repeat, baseline
    repeat) pair; with "bootstrap": the 2.5th and 97.5th percentiles of the ratio of medians over resamples of
    the repeats (fixed seed). ``inconclusive``: the range includes 1.0, or a side has a single repeat (no spread
    to judge by).
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

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __str__(self) -> str:
        verdict = "inconclusive" if self.inconclusive else "conclusive"
        return f"{self.ratio:.3f}x ({self.low:.3f}-{self.high:.3f}, {verdict}) at {self.concurrency} streams"


ReportLike = BenchReport | Mapping[str, Any]


def _tok_s_values(reports: ReportLike | Sequence[ReportLike], concurrency: int) -> list[float]:
    """Every repeat's output tok/s at ``concurrency``, from one report or several (interleaved server starts)."""
    items: Iterable[ReportLike] = [reports] if isinstance(reports, BenchReport | Mapping) else reports
    values: list[float] = []
    for item in items:
        levels = item.to_dict()["levels"] if isinstance(item, BenchReport) else item.get("levels", [])
        for lv in levels:
            if lv.get("concurrency") == concurrency:
                values += [float(r["output_tok_s"]) for r in lv.get("runs", []) if r.get("output_tok_s", 0) > 0]
    return values


def speedup(
    baseline: ReportLike | Sequence[ReportLike],
    treatment: ReportLike | Sequence[ReportLike],
    concurrency: int,
    *,
    method: str = "pairs",
    resamples: int = 2000,
    seed: int = 0,
) -> Speedup:
    """Speedup of ``treatment`` over ``baseline`` at ``concurrency``. Each side is a :class:`BenchReport`, its
    ``to_dict()`` (as stored), or a list of them (one per server start): their repeats are pooled."""
    base, treat = _tok_s_values(baseline, concurrency), _tok_s_values(treatment, concurrency)
    for name, values in (("baseline", base), ("treatment", treat)):
        if not values:
            raise ValueError(f"speedup: the {name} has no repeat with output at {concurrency} streams")
    ratio = statistics.median(treat) / statistics.median(base)
    if method == "pairs":
        low, high = min(treat) / max(base), max(treat) / min(base)
    elif method == "bootstrap":
        rng = random.Random(seed)
        ratios = sorted(
            statistics.median(rng.choices(treat, k=len(treat))) / statistics.median(rng.choices(base, k=len(base)))
            for _ in range(resamples)
        )
        low, high = percentile(ratios, 2.5), percentile(ratios, 97.5)
    else:
        raise ValueError(f"speedup: method must be 'pairs' or 'bootstrap', got {method!r}")
    single = len(base) < 2 or len(treat) < 2
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
    )
