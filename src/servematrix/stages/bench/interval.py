"""How sure a speedup is: a t-interval over per-start medians, and how many server starts would settle it.

Why this rule (issue 35). A server start is the unit that varies: repeats of one start share its state
(allocator layout, compiled kernels, graph pools, CPU placement), and on the H200 the spread between starts was
as large as the effects compared. So each start is reduced to one figure, the median of its repeats, and the
two modes are compared over those figures, on a log scale (a speedup is a ratio):

    d = mean(log m_treatment) - mean(log m_baseline),  se = sqrt(s_t^2/n_t + s_b^2/n_b)
    interval = exp(d -/+ t(0.975, Welch df) * se)

Why a t-interval and not a hierarchical bootstrap: matrices run 2-3 starts per mode. A bootstrap that resamples
starts has only n^n orderings of n starts (4 for two starts, of which two resample one start twice) and its
percentile interval undercovers badly at that size; the t-interval is exact for normal per-start log-medians
and its width already pays for the few starts (t = 12.7 at one degree of freedom). Both narrow as data grows:
more starts shrink se by 1/sqrt(n) and the t quantile with it; more repeats make each start's median less
noisy, so the spread between starts shrinks towards the true one. The old rule (the smallest and largest ratio
of any pair of repeats) could only widen as repeats were added.

No scipy: Student's t distribution through the regularized incomplete beta function (a continued fraction,
Numerical Recipes' ``betacf``), its quantile by bisection. Exact to 1e-9, which is more than figures need.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

CONFIDENCE = 0.95
# The effect a "starts needed" figure is planned for, and the chance of resolving it.
PLAN_EFFECT = 0.10
PLAN_POWER = 0.8
MAX_PLANNED_STARTS = 1000


def _betacf(a: float, b: float, x: float) -> float:
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-15:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with ``df`` (> 0, not necessarily whole) degrees of freedom."""
    tail = 0.5 * _betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile (0 < p < 1) of Student's t with ``df`` degrees of freedom."""
    if not 0.0 < p < 1.0 or df <= 0:
        raise ValueError(f"t_quantile: need 0 < p < 1 and df > 0, got p={p}, df={df}")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        hi *= 2.0
    for _ in range(200):
        mid = (lo + hi) / 2.0
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12 * max(1.0, hi):
            break
    return (lo + hi) / 2.0


@dataclass(frozen=True, kw_only=True)
class StartInterval:
    """``better`` over ``worse`` from their per-start medians: the ratio (geometric mean of the starts'
    medians, over the other side's) and its interval; None where a side has a single start (no spread
    between starts to judge by). ``spread``: the pooled standard deviation of log per-start medians (the
    between-start spread, about the relative spread of a start's figure); None with a single start a side."""

    ratio: float
    low: float | None
    high: float | None
    df: float | None
    spread: float | None
    starts: tuple[int, int]  # (better side, worse side)


def _log_medians(starts: Sequence[Sequence[float]]) -> list[float]:
    return [math.log(statistics.median(values)) for values in starts if values]


def start_interval(
    better: Sequence[Sequence[float]], worse: Sequence[Sequence[float]], *, confidence: float = CONFIDENCE
) -> StartInterval:
    """The interval of ``better``/``worse`` from each side's repeats grouped by server start (Welch's t on the
    log per-start medians). Values must be > 0."""
    lb, lw = _log_medians(better), _log_medians(worse)
    if not lb or not lw:
        raise ValueError("start_interval: a side has no start with figures")
    d = statistics.fmean(lb) - statistics.fmean(lw)
    if len(lb) < 2 or len(lw) < 2:
        return StartInterval(ratio=math.exp(d), low=None, high=None, df=None, spread=None, starts=(len(lb), len(lw)))
    vb, vw = statistics.variance(lb), statistics.variance(lw)
    qb, qw = vb / len(lb), vw / len(lw)
    se = math.sqrt(qb + qw)
    pooled = math.sqrt(((len(lb) - 1) * vb + (len(lw) - 1) * vw) / (len(lb) + len(lw) - 2))
    if se == 0.0:  # identical medians within each side: no spread measured, the interval is the point
        return StartInterval(
            ratio=math.exp(d), low=math.exp(d), high=math.exp(d), df=None, spread=0.0, starts=(len(lb), len(lw))
        )
    df = (qb + qw) ** 2 / (qb**2 / (len(lb) - 1) + qw**2 / (len(lw) - 1))
    half = t_quantile(0.5 + confidence / 2.0, df) * se
    return StartInterval(
        ratio=math.exp(d),
        low=math.exp(d - half),
        high=math.exp(d + half),
        df=df,
        spread=pooled,
        starts=(len(lb), len(lw)),
    )


def starts_needed(
    spread: float, effect: float = PLAN_EFFECT, *, power: float = PLAN_POWER, confidence: float = CONFIDENCE
) -> int | None:
    """Server starts per mode that would likely (``power``) tell an ``effect`` (0.10: a 10 % speedup) from
    none, given ``spread`` (the standard deviation of a start's log-median, as measured): the smallest n with
    (t(1 - alpha/2, 2n-2) + t(power, 2n-2)) * spread * sqrt(2/n) <= log(1 + effect). None past
    ``MAX_PLANNED_STARTS`` (the spread swamps the effect)."""
    if spread <= 0:
        return 2
    target = math.log1p(effect)
    for n in range(2, MAX_PLANNED_STARTS + 1):
        df = 2 * n - 2
        if (t_quantile(0.5 + confidence / 2.0, df) + t_quantile(power, df)) * spread * math.sqrt(2.0 / n) <= target:
            return n
    return None
