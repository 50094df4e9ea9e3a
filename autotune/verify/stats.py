"""The statistics autotune's claims rest on: medians of paired ratios, a distribution-free
interval for a median, and the interval a re-measurement is expected to land in.

Speeds on a shared machine are skewed and stepwise (a neighbour arrives, a clock drops),
so a one-off disturbed window must move an interval by one order statistic, not blow it
up; ratios are taken pair by pair (candidate and baseline measured seconds apart) so that
a slow minute slows both sides of the ratio.
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Sequence


def median_interval(values: Sequence[float], *, confidence: float = 0.9) -> tuple[float, float, float]:
    """Distribution-free interval for the median: the order statistics x(k), x(n-k+1)
    with the largest k whose coverage (sign test) is still >= ``confidence``.
    Returns (low, high, actual coverage)."""
    xs = sorted(values)
    n = len(xs)

    def coverage(k: int) -> float:  # P(x(k) <= median <= x(n-k+1))
        return 1 - 2 * sum(math.comb(n, i) for i in range(k)) / 2**n

    k = 1
    while k + 1 <= (n + 1) // 2 and coverage(k + 1) >= confidence:
        k += 1
    return xs[k - 1], xs[n - k], coverage(k)


def ratio_interval(ratios: Sequence[float], *, confidence: float = 0.9) -> dict[str, float]:
    """Median ratio over the rounds and its distribution-free interval."""
    low, high, level = median_interval(ratios, confidence=confidence)
    return {"median": statistics.median(ratios), "ci_low": low, "ci_high": high,
            "ci_level": level, "rounds": len(ratios)}


def paired_ratio(num: Sequence[float], den: Sequence[float]) -> dict[str, float]:
    """``num`` over ``den``, measurement against measurement of the same round."""
    return ratio_interval([a / b for a, b in zip(num, den)])


def spread(values: Sequence[float]) -> float:
    """Highest over lowest: 1.0 when every measurement agreed."""
    low = min(values)
    return max(values) / low if low > 0 else math.inf


def t_quantile(p: float, df: int) -> float:
    """Student's t quantile, by bisection on its distribution function (integrated
    numerically): exact enough for an interval's ends, with no scipy dependency."""
    if not 0.5 <= p < 1:
        raise ValueError(f"t_quantile takes 0.5 <= p < 1, got {p}")
    norm = math.gamma((df + 1) / 2) / (math.sqrt(df * math.pi) * math.gamma(df / 2))

    def cdf(x: float) -> float:  # 0.5 + the integral of the density over [0, x] (Simpson)
        steps = 400
        h = x / steps
        f = [norm * (1 + (i * h) ** 2 / df) ** (-(df + 1) / 2) for i in range(steps + 1)]
        return 0.5 + h / 3 * (f[0] + f[-1] + 4 * sum(f[1:-1:2]) + 2 * sum(f[2:-1:2]))

    low, high = 0.0, 1.0
    while cdf(high) < p:
        high *= 2
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if cdf(mid) < p else (low, mid)
    return (low + high) / 2


def rerun_interval(ratios: Sequence[float], *, level: float = 0.95,
                   rerun: int | None = None) -> tuple[float, float]:
    """Where the mean ratio of a re-measurement of ``rerun`` pairs (as many as these by
    default) is expected to land, with probability ``level``: a prediction interval on
    the log ratios, mean +- t * s * sqrt(1/n + 1/m). It is wider than an interval for the
    median itself because the re-measurement has noise of its own; it covers the spread
    the machine showed while these pairs ran, not a state it enters later."""
    n = len(ratios)
    if n < 2:
        raise ValueError("an interval needs at least two ratios")
    logs = [math.log(r) for r in ratios]
    m = rerun or n
    half = t_quantile(0.5 + level / 2, n - 1) * statistics.stdev(logs) * math.sqrt(1 / n + 1 / m)
    centre = statistics.fmean(logs)
    return math.exp(centre - half), math.exp(centre + half)


def geometric_interval(ratios: Sequence[float], *, level: float = 0.95) -> dict[str, float]:
    """Geometric mean of the ratios and a t interval for it (on the log ratios). Unlike
    medians, geometric means of paired ratios telescope: the steps of a path measured in
    the same rounds multiply exactly to the whole."""
    logs = [math.log(r) for r in ratios]
    centre = statistics.fmean(logs)
    half = (t_quantile(0.5 + level / 2, len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
            if len(logs) > 1 else math.inf)
    return {"ratio": math.exp(centre), "ci_low": math.exp(centre - half),
            "ci_high": math.exp(centre + half) if half != math.inf else math.inf,
            "ci_level": level, "rounds": len(logs)}
