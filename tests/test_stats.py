import json
import math
import random
import statistics

import pytest

from autotune.document.interval import Interval
from autotune.verify import stats


def test_median_interval_uses_order_statistics_with_sign_test_coverage():
    low, high, level = stats.median_interval([5, 1, 4, 2, 3])
    assert (low, high) == (1, 5) and level == pytest.approx(1 - 2 / 32)
    low, high, level = stats.median_interval(list(range(10)))
    assert (low, high) == (1, 8) and level >= 0.9


def test_one_disturbed_round_does_not_decide_the_interval():
    ratios = [1.3, 1.25, 1.35, 1.28, 0.2, 1.31, 1.27, 1.33, 1.29, 1.3]
    interval = stats.ratio_interval(ratios)
    assert interval.low > 1.0, "a single outlier round must not hide a steady 1.3x"
    assert interval.ratio == pytest.approx(1.295)


def test_an_interval_that_includes_one_is_not_faster():
    interval = stats.ratio_interval([1.1, 0.95, 1.2, 0.9, 1.05])
    assert interval.low <= 1.0 <= interval.high


def test_paired_ratio_divides_round_by_round():
    assert stats.paired_ratio([2, 4, 6], [1, 2, 3]).ratio == 2


def test_intervals_write_the_keys_the_documents_have_always_held():
    # best_config.json and the reports carry these dicts' keys, in this order: a rename
    # or a reorder would change every document written from now on
    interval = stats.ratio_interval([1.1, 0.95, 1.2, 0.9, 1.05])
    assert list(interval.to_json()) == ["median", "ci_low", "ci_high", "ci_level", "rounds"]
    assert isinstance(interval.to_json()["rounds"], int)
    assert Interval.from_json(json.loads(json.dumps(interval.to_json()))) == interval
    path = stats.geometric_interval([1.1, 0.95, 1.2, 0.9, 1.05])
    assert list(path.to_json(centre="ratio")) == ["ratio", "ci_low", "ci_high", "ci_level", "rounds"]
    assert Interval.from_json(json.loads(json.dumps(path.to_json(centre="ratio"))), centre="ratio") == path


@pytest.mark.parametrize(("p", "df", "expected"), [
    (0.975, 5, 2.5706), (0.995, 5, 4.0321), (0.975, 1, 12.7062), (0.95, 30, 1.6973),
])
def test_t_quantile_matches_the_tables(p, df, expected):
    assert stats.t_quantile(p, df) == pytest.approx(expected, abs=2e-3)


def test_speedup_interval_holds_a_rerun_in_another_session_as_often_as_it_says():
    """Simulated machine: each session's ratio is shifted (half of SESSION_DRIFT_SD's
    variance each, so that two sessions differ by it), each run has log-normal noise. A
    re-run's median, in a session of its own, lands in the interval from the first at least
    about 95% of the time, and above its lower bound as often."""
    rng = random.Random(7)

    def session() -> tuple[list[float], list[float]]:
        shift = rng.gauss(0.0, stats.SESSION_DRIFT_SD / math.sqrt(2))
        return ([100 * math.exp(rng.gauss(0, 0.02)) for _ in range(6)],
                [200 * math.exp(shift + rng.gauss(0, 0.02)) for _ in range(6)])

    inside = above = 0
    trials = 600
    for _ in range(trials):
        figures = stats.speedup_interval(*session(), level=0.95)
        base, cand = session()
        again = statistics.median(c / b for c, b in zip(cand, base))
        inside += figures.interval.low <= again <= figures.interval.high
        above += again >= figures.lower
    assert 0.93 <= inside / trials <= 0.99 and 0.93 <= above / trials <= 0.99, (inside, above)


def test_spread_is_highest_over_lowest():
    assert stats.spread([2.0, 3.0, 2.5]) == 1.5


def test_two_speeds_needs_a_clear_gap_and_a_noisy_sample_at_one_speed_has_none():
    rng = random.Random(3)
    one_speed = [[1000 * math.exp(rng.gauss(0, sd)) for _ in range(n)]
                 for n in (5, 6, 8) for sd in (0.01, 0.03, 0.05) for _ in range(100)]
    flagged = sum(stats.two_speeds(rates) is not None for rates in one_speed)
    assert flagged <= 0.01 * len(one_speed), flagged
    assert stats.two_speeds([14_500, 19_400, 14_700, 19_600, 14_400, 19_500]) == [0, 1, 0, 1, 0, 1]
    # one run of six at the other speed, far from five that agree: it ran there once
    assert stats.two_speeds([19_600, 19_400, 14_500, 19_500, 19_700, 19_450]) == [1, 1, 0, 1, 1, 1]
    # a 6% gap is noise, however tight the groups
    assert stats.two_speeds([100, 100.5, 100.2, 106, 106.3, 106.1]) is None
    # a wide sample whose largest gap is not far beyond its groups' ranges
    assert stats.two_speeds([100, 104, 109, 121, 126, 131]) is None


def test_drift_is_read_where_a_series_moves_monotonically_and_not_from_noise():
    assert stats.drift([0.0, 0.02, 0.05, 0.06, 0.1, 0.12]) == pytest.approx(0.12, abs=0.02)
    assert stats.drift([0.0, 0.05, -0.02, 0.04, -0.01, 0.03]) == 0.0
    assert stats.kendall_tau([1, 2, 3, 4]) == 1.0 and stats.kendall_tau([4, 3, 2, 1]) == -1.0


def test_speedup_interval_reads_raw_pairs_and_leads_with_a_lower_bound():
    base = [100.0, 101.0, 99.0, 100.5, 99.5, 100.0]
    cand = [200.0, 203.0, 197.0, 200.0, 201.0, 199.0]
    figures = stats.speedup_interval(base, cand, level=0.95)
    assert figures.interval.ratio == pytest.approx(statistics.median(c / b for c, b in zip(cand, base)))
    assert figures.interval.low < figures.lower < figures.interval.ratio < figures.interval.high
    assert figures.pairs == figures.rerun == 6 and figures.trend == 0.0
    # a steady sample's interval is still as wide as a drift from one session to the next
    z = statistics.NormalDist().inv_cdf(0.975)
    assert math.log(figures.interval.high / figures.interval.ratio) >= z * stats.SESSION_DRIFT_SD * 0.99
    # none when nothing drifts between sessions: the pairs' own noise alone
    own = stats.speedup_interval(base, cand, session_sd=0.0)
    assert own.interval.high / own.interval.low < figures.interval.high / figures.interval.low
    with pytest.raises(ValueError):
        stats.speedup_interval(base, cand[:-1])


def test_speedup_interval_covers_either_speed_of_a_baseline_that_runs_at_two():
    base = [14_500.0, 19_500.0, 14_600.0, 19_400.0, 14_450.0, 19_550.0]
    cand = [80_000.0, 80_500.0, 79_600.0, 80_200.0, 79_900.0, 80_100.0]
    figures = stats.speedup_interval(base, cand)
    assert figures.baseline.two_speeds and figures.baseline.speeds[0] < 15_000 < 19_000 < figures.baseline.speeds[1]
    assert figures.baseline.runs == (3, 3) and figures.baseline.step is None and not figures.candidate.two_speeds
    assert figures.interval.low < 80_000 / 19_500 and figures.interval.high > 80_000 / 14_500
    # the noise is what is left about each speed: tight
    assert figures.noise_sd < 0.02
    stepped = stats.speedup_interval([14_500.0, 14_600.0, 14_450.0, 19_500.0, 19_400.0, 19_550.0], cand)
    assert stepped.baseline.step == (pytest.approx(14_500.0), pytest.approx(19_500.0))
