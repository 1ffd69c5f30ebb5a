"""The speedup rule converges (issue 35): a t-interval over per-start medians narrows as starts and repeats
grow, finds a planted 10 % effect, calls no null effect, and plans the starts an indeterminate figure needs.
Synthetic data: each server start shifts its figures by a lognormal factor, each repeat by another."""

import math
import random

import pytest

from servematrix.stages.bench import speedup
from servematrix.stages.bench.interval import start_interval, starts_needed, t_cdf, t_quantile


def _record(rng: random.Random, *, starts: int, repeats: int, level: float, between: float, within: float) -> dict:
    """A pooled record at 32 streams: ``starts`` server starts of ``repeats`` repeats each."""
    runs = []
    for start in range(1, starts + 1):
        shift = rng.gauss(0.0, between)
        for repeat in range(repeats):
            value = level * math.exp(shift + rng.gauss(0.0, within))
            runs.append({"repeat": repeat, "start": start, "output_tok_s": value})
    return {"levels": [{"concurrency": 32, "runs": runs}]}


def _median_width(*, starts: int, repeats: int, between: float, within: float, trials: int = 40) -> float:
    widths = []
    for seed in range(trials):
        rng = random.Random(seed)
        base = _record(rng, starts=starts, repeats=repeats, level=100, between=between, within=within)
        treat = _record(rng, starts=starts, repeats=repeats, level=100, between=between, within=within)
        found = speedup(base, treat, 32)
        widths.append(math.log(found.high / found.low))
    return sorted(widths)[len(widths) // 2]


def test_t_distribution_matches_the_tables():
    assert t_quantile(0.975, 1) == pytest.approx(12.7062, abs=1e-4)
    assert t_quantile(0.975, 2) == pytest.approx(4.3027, abs=1e-4)
    assert t_quantile(0.975, 10) == pytest.approx(2.2281, abs=1e-4)
    assert t_quantile(0.8, 30) == pytest.approx(0.8538, abs=1e-4)
    assert t_quantile(0.025, 5) == pytest.approx(-2.5706, abs=1e-4)
    assert t_cdf(0.0, 3.5) == pytest.approx(0.5)


def test_more_starts_narrow_the_interval():
    widths = [_median_width(starts=n, repeats=3, between=0.05, within=0.05) for n in (2, 3, 5, 8)]
    assert widths == sorted(widths, reverse=True) and widths[-1] < widths[0] / 4


def test_more_repeats_narrow_the_interval_when_repeats_are_the_noise():
    # Starts barely differ; each repeat is noisy: more repeats make each start's median, and so the
    # interval, tighter. The old min-max pairs rule could only widen as repeats were added.
    widths = [_median_width(starts=3, repeats=n, between=0.005, within=0.10) for n in (2, 6, 20)]
    assert widths == sorted(widths, reverse=True) and widths[-1] < widths[0] / 2


def test_a_planted_ten_percent_effect_is_found():
    found = 0
    for seed in range(40):
        rng = random.Random(1000 + seed)
        base = _record(rng, starts=6, repeats=5, level=100, between=0.03, within=0.05)
        treat = _record(rng, starts=6, repeats=5, level=110, between=0.03, within=0.05)
        result = speedup(base, treat, 32)
        assert result.verdict != "slower"
        found += result.verdict == "faster"
    assert found >= 32  # power well above 80 % at this spread and six starts a side


def test_a_null_effect_is_not_called():
    called = 0
    for seed in range(200):
        rng = random.Random(5000 + seed)
        base = _record(rng, starts=3, repeats=3, level=100, between=0.08, within=0.05)
        treat = _record(rng, starts=3, repeats=3, level=100, between=0.08, within=0.05)
        called += speedup(base, treat, 32).verdict != "indeterminate"
    assert called <= 20  # nominal 5 % (10 of 200); a rule that trusted repeats as independent calls far more


def test_an_indeterminate_figure_says_how_many_starts_would_resolve_ten_percent():
    rng = random.Random(7)
    base = _record(rng, starts=2, repeats=3, level=100, between=0.08, within=0.03)
    treat = _record(rng, starts=2, repeats=3, level=105, between=0.08, within=0.03)
    found = speedup(base, treat, 32)
    assert found.verdict == "indeterminate" and found.start_spread is not None
    assert found.starts_needed == starts_needed(found.start_spread, 0.10) and found.starts_needed > 2
    assert f"~{found.starts_needed} starts per mode ({found.starts_needed - 2} more)" in found.range_text
    # A smaller spread needs fewer starts; one that dwarfs the effect needs more than can be planned.
    assert starts_needed(0.02) < starts_needed(0.05) < starts_needed(0.15)
    assert starts_needed(2.0) is None


def test_the_interval_is_oriented_and_its_point_is_the_ratio_of_start_medians():
    found = start_interval([[110.0, 111.0, 109.0], [121.0, 120.0, 122.0]], [[100.0, 99.0], [110.0, 111.0]])
    assert found.ratio == pytest.approx(math.sqrt(110 * 121) / math.sqrt(99.5 * 110.5))
    assert found.low is not None and found.high is not None and found.low < found.ratio < found.high
    assert found.starts == (2, 2)
