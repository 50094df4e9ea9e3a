"""The statistics autotune's claims rest on: medians of paired ratios, a distribution-free
interval for a median, and the interval a re-measurement is expected to land in.

Speeds on a shared machine are skewed and stepwise (a neighbour arrives, a clock drops),
so a one-off disturbed window must move an interval by one order statistic, not blow it
up; ratios are taken pair by pair (candidate and baseline measured seconds apart) so that
a slow minute slows both sides of the ratio.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import statistics
from collections.abc import Sequence

from autotune.document.interval import Interval


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


def ratio_interval(ratios: Sequence[float], *, confidence: float = 0.9) -> Interval:
    """Median ratio over the rounds and its distribution-free interval."""
    low, high, level = median_interval(ratios, confidence=confidence)
    return Interval(ratio=statistics.median(ratios), low=low, high=high, level=level, rounds=len(ratios))


def paired_ratio(num: Sequence[float], den: Sequence[float]) -> Interval:
    """``num`` over ``den``, measurement against measurement of the same round."""
    return ratio_interval([a / b for a, b in zip(num, den)])


def spread(values: Sequence[float]) -> float:
    """Highest over lowest: 1.0 when every measurement agreed."""
    low = min(values)
    return max(values) / low if low > 0 else math.inf


@functools.cache
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


def geometric_interval(ratios: Sequence[float], *, level: float = 0.95) -> Interval:
    """Geometric mean of the ratios and a t interval for it (on the log ratios). Unlike
    medians, geometric means of paired ratios telescope: the steps of a path measured in
    the same rounds multiply exactly to the whole."""
    logs = [math.log(r) for r in ratios]
    centre = statistics.fmean(logs)
    half = (t_quantile(0.5 + level / 2, len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
            if len(logs) > 1 else math.inf)
    return Interval(ratio=math.exp(centre), low=math.exp(centre - half),
                    high=math.exp(centre + half) if half != math.inf else math.inf, level=level, rounds=len(logs))


# --- the printed speedup: where a re-run of the standalone pairs lands -------------------

# Between sessions, a ratio moves by more than the pairs of one session show: the machine's
# state (neighbours, clocks, caches, which cores a process lands on) changes over minutes,
# and every pair of one session shares it. The standard deviation of the difference between
# two sessions' log ratios (a re-check's median against the first session's), beyond what
# the pairs' own noise explains: measured by bench/calibration.py (re-checks of stored
# sessions' pairs, re-scored with ``speedup_interval``); until its data sets it, 0.06 (about
# 6%), from the README example's re-check, 1.87x printed and 2.02x measured minutes later.
SESSION_DRIFT_SD = 0.06
# How much of one side's own drift over the pairs (its rate, not the ratio) a re-run's ratio
# is taken to follow: the README example's baseline rose 17% within two minutes and its
# ratio 8%. Also to be set from bench/calibration.py's data.
SIDE_DRIFT_SHARE = 0.5
# A series drifts when it is this monotone across the pairs (Kendall's tau, |tau|): at 5 or 6
# pairs, at most two or three out-of-order couples of the ten or fifteen.
TREND_TAU = 0.6
# A drift is named in the summary from this much over the pairs (log: 10%); a smaller one
# still widens the interval.
TREND_NAMED = math.log(1.1)
# Two speeds: the rates sorted and split at their largest gap, the gap at least
# TWO_SPEEDS_GAP of the slower group's rate (log) and TWO_SPEEDS_SPREAD times the widest
# group's own range (log), each group at least two runs. A single run apart from the rest
# (at least TWO_SPEEDS_ALONE_AMONG runs) counts as a second speed when its gap is
# TWO_SPEEDS_ALONE_SPREAD times the others' range: at 5 or 6 pairs, a baseline that lands at
# either of two speeds from one start to the next shows one run at the other speed one time
# in four or five.
TWO_SPEEDS_GAP = math.log(1.1)
TWO_SPEEDS_SPREAD = 3.0
TWO_SPEEDS_ALONE_AMONG = 4
TWO_SPEEDS_ALONE_SPREAD = 4.0


def two_speeds(rates: Sequence[float]) -> list[int] | None:
    """Whether ``rates`` (one side's runs) fall into two groups, a clear gap between them:
    for each run 0 (the slower group) or 1 (the faster); None for one group. A unimodal
    noisy sample's largest gap is not several times its groups' own ranges."""
    n = len(rates)
    if n < 4 or min(rates) <= 0:
        return None
    logs = sorted(math.log(r) for r in rates)
    least = 1 if n > TWO_SPEEDS_ALONE_AMONG else 2
    cut = max(range(least, n - least + 1), key=lambda i: logs[i] - logs[i - 1])
    gap = logs[cut] - logs[cut - 1]
    within = max(logs[cut - 1] - logs[0], logs[-1] - logs[cut])
    alone = cut == 1 or cut == n - 1
    if gap < TWO_SPEEDS_GAP or gap < (TWO_SPEEDS_ALONE_SPREAD if alone else TWO_SPEEDS_SPREAD) * within:
        return None
    split = (logs[cut - 1] + logs[cut]) / 2
    return [int(math.log(r) > split) for r in rates]


def kendall_tau(values: Sequence[float]) -> float:
    """Kendall's tau of ``values`` against their order: 1 rising throughout, -1 falling."""
    n = len(values)
    if n < 2:
        return 0.0
    s = sum((values[j] > values[i]) - (values[j] < values[i]) for i in range(n) for j in range(i + 1, n))
    return s / (n * (n - 1) / 2)


def theil_sen(values: Sequence[float]) -> float:
    """The median of the slopes between every two of ``values`` (per step of their order):
    a trend one disturbed point cannot set."""
    slopes = [(values[j] - values[i]) / (j - i) for i in range(len(values)) for j in range(i + 1, len(values))]
    return statistics.median(slopes) if slopes else 0.0


def drift(values: Sequence[float]) -> float:
    """How far (in the units of ``values``, logs here) a series moved from its first to its
    last, where it moved monotonically (``TREND_TAU``); 0.0 where it did not."""
    if len(values) < 4 or abs(kendall_tau(values)) < TREND_TAU:
        return 0.0
    return theil_sen(values) * (len(values) - 1)


@dataclasses.dataclass(frozen=True)
class Side:
    """One side's rates over the pairs, as the interval read them: ``speeds`` the median
    rate of each group (one, or two, slower first, where it ran at two speeds) and
    ``drift`` its fitted rate at the first pair and the last where it drifted (None where
    it did not); ``step``: where its two speeds came one after the other, not from run to
    run, the first speed and the second; ``runs`` how many runs each speed had."""

    speeds: tuple[float, ...]
    drift: tuple[float, float] | None
    step: tuple[float, float] | None = None
    runs: tuple[int, ...] = ()

    @property
    def two_speeds(self) -> bool:
        return len(self.speeds) == 2


@dataclasses.dataclass(frozen=True)
class SpeedupEstimate:
    """``speedup_interval``'s figures: the pairs' median ratio and where a re-run's median
    ratio lands with probability ``interval.level`` (``interval``); the figure it stays above
    with that probability (``lower``); the parts that made them (log ratios); and what each
    side's rates showed."""

    interval: Interval
    lower: float
    pairs: int
    rerun: int
    noise_sd: float  # the pairs' own spread, each side's speeds and drift taken out
    session_sd: float  # SESSION_DRIFT_SD
    trend: float  # how far the pairs drifted, as counted
    baseline: Side
    candidate: Side
    df: int = 1  # the noise's degrees of freedom

    def lower_after(self, pairs: int) -> float:
        """The figure a re-run stays above once ``pairs`` pairs are measured, where the
        pairs to come spread as these did: what more pairs can still do for ``lower``."""
        more = max(0, pairs - self.pairs)
        level = self.interval.level
        now = _half(level, df=self.df, noise=self.noise_sd, n=self.pairs, m=self.rerun,
                    session_sd=self.session_sd, trend=self.trend)
        then = _half(level, df=self.df + more, noise=self.noise_sd, n=self.pairs + more,
                     m=max(self.rerun, pairs), session_sd=self.session_sd, trend=self.trend)
        return min(self.interval.ratio, self.lower * math.exp(now - then))


def _half(p: float, *, df: int, noise: float, n: int, m: int, session_sd: float, trend: float) -> float:
    """Half the interval's width (log) at ``p``: the pairs' own noise (t, with a re-run's
    median of ``m``), the drift between sessions and the drift within the pairs."""
    z = statistics.NormalDist().inv_cdf(p)
    own = t_quantile(p, df) * noise * math.sqrt(1 / n + math.pi / (2 * m))
    return math.sqrt(own ** 2 + (z * session_sd) ** 2 + (z * trend) ** 2)


def _side(rates: Sequence[float]) -> tuple[Side, list[float], list[int]]:
    """A side's shape, its log rates less their group's mean, and each run's group."""
    logs = [math.log(r) for r in rates]
    groups = two_speeds(rates) or [0] * len(rates)
    means = {g: statistics.fmean(x for x, k in zip(logs, groups) if k == g) for g in set(groups)}
    residual = [x - means[g] for x, g in zip(logs, groups)]
    speeds = tuple(statistics.median(r for r, k in zip(rates, groups) if k == g) for g in sorted(means))
    moved = drift(residual)
    fitted = None
    if abs(moved) >= TREND_NAMED:
        centre = statistics.fmean(logs)
        fitted = (math.exp(centre - moved / 2), math.exp(centre + moved / 2))
    step = None
    if (len(speeds) == 2 and min(groups.count(0), groups.count(1)) >= 2
            and sum(a != b for a, b in zip(groups, groups[1:])) == 1):
        step = (speeds[groups[0]], speeds[groups[-1]])
    runs = tuple(groups.count(g) for g in sorted(means))
    return Side(speeds=speeds, drift=fitted, step=step, runs=runs), residual, groups


def speedup_interval(baseline_rates: Sequence[float], candidate_rates: Sequence[float], *,
                     level: float = 0.95, rerun: int | None = None,
                     session_sd: float = SESSION_DRIFT_SD) -> SpeedupEstimate:
    """Where the median ratio of a re-run of ``rerun`` standalone pairs (as many as these by
    default) lands, from the pairs' raw rates alone, pair i being ``candidate_rates[i]``
    against ``baseline_rates[i]``. Pure: a calibration script re-scores stored pairs with it.

    On the log ratios it adds, root-sum-square, three parts, each at its quantile: the pairs'
    own noise (t with the pairs' degrees of freedom, s * sqrt(1/n + pi/(2m)): our mean and a
    re-run's median of m), a between-session drift (``session_sd``, normal) and the drift
    within the pairs (normal): the most the ratios moved monotonically over them, or
    ``SIDE_DRIFT_SHARE`` of the most either side's rate did. A side that ran at two speeds
    (``two_speeds``) is read as two groups: the noise is what is left about each group's mean,
    and the interval runs from the lowest ratio of a group's speed against a group's speed to
    the highest, so that it covers a re-run whose runs land in either group."""
    n = len(baseline_rates)
    if n != len(candidate_rates):
        raise ValueError("as many baseline rates as candidate rates: one of each a pair")
    if n < 2:
        raise ValueError("an interval needs at least two pairs")
    if min(*baseline_rates, *candidate_rates) <= 0:
        raise ValueError("rates must be positive")
    m = rerun or n
    base, base_left, base_groups = _side(baseline_rates)
    cand, cand_left, cand_groups = _side(candidate_rates)
    left = [c - b for c, b in zip(cand_left, base_left)]
    df = max(1, n - len(base.speeds) - len(cand.speeds) + 1)
    noise = math.sqrt(sum(e * e for e in left) / df)
    trend = max(abs(drift(left)), SIDE_DRIFT_SHARE * abs(drift(base_left)),
                SIDE_DRIFT_SHARE * abs(drift(cand_left)))

    def mean_log(rates: Sequence[float], groups: list[int], g: int) -> float:
        return statistics.fmean(math.log(r) for r, k in zip(rates, groups) if k == g)

    centres = [mean_log(candidate_rates, cand_groups, gc) - mean_log(baseline_rates, base_groups, gb)
               for gc in set(cand_groups) for gb in set(base_groups)]

    def half(p: float) -> float:
        return _half(p, df=df, noise=noise, n=n, m=m, session_sd=session_sd, trend=trend)

    two_sided = half(0.5 + level / 2)
    median = statistics.median(c / b for c, b in zip(candidate_rates, baseline_rates))
    return SpeedupEstimate(
        interval=Interval(ratio=median, low=min(median, math.exp(min(centres) - two_sided)),
                          high=max(median, math.exp(max(centres) + two_sided)), level=level, rounds=n),
        lower=min(median, math.exp(min(centres) - half(level))), pairs=n, rerun=m,
        noise_sd=noise, session_sd=session_sd, trend=trend, baseline=base, candidate=cand, df=df)
