import math
import random
import statistics

import pytest

from autotune.verify import stats


def test_median_interval_uses_order_statistics_with_sign_test_coverage():
    low, high, level = stats.median_interval([5, 1, 4, 2, 3])
    assert (low, high) == (1, 5) and level == pytest.approx(1 - 2 / 32)
    low, high, level = stats.median_interval(list(range(10)))
    assert (low, high) == (1, 8) and level >= 0.9


def test_one_disturbed_round_does_not_decide_the_interval():
    ratios = [1.3, 1.25, 1.35, 1.28, 0.2, 1.31, 1.27, 1.33, 1.29, 1.3]
    interval = stats.ratio_interval(ratios)
    assert interval["ci_low"] > 1.0, "a single outlier round must not hide a steady 1.3x"
    assert interval["median"] == pytest.approx(1.295)


def test_an_interval_that_includes_one_is_not_faster():
    interval = stats.ratio_interval([1.1, 0.95, 1.2, 0.9, 1.05])
    assert interval["ci_low"] <= 1.0 <= interval["ci_high"]


def test_paired_ratio_divides_round_by_round():
    assert stats.paired_ratio([2, 4, 6], [1, 2, 3])["median"] == 2


@pytest.mark.parametrize(("p", "df", "expected"), [
    (0.975, 5, 2.5706), (0.995, 5, 4.0321), (0.975, 1, 12.7062), (0.95, 30, 1.6973),
])
def test_t_quantile_matches_the_tables(p, df, expected):
    assert stats.t_quantile(p, df) == pytest.approx(expected, abs=2e-3)


def test_rerun_interval_holds_a_rerun_of_the_same_machine_as_often_as_it_says():
    """Simulated machine: log-normal pair ratios around 2x. A re-measurement's geometric
    mean lands in the interval from the first measurement about 95% of the time; the
    median's own interval, read as a forecast of a re-run, is too narrow for that."""
    rng = random.Random(7)
    draw = lambda: [math.exp(rng.gauss(math.log(2.0), 0.1)) for _ in range(6)]  # noqa: E731
    inside = 0
    trials = 800
    for _ in range(trials):
        low, high = stats.rerun_interval(draw(), level=0.95)
        again = math.exp(statistics.fmean(math.log(r) for r in draw()))
        inside += low <= again <= high
    assert 0.92 <= inside / trials <= 0.98


def test_spread_is_highest_over_lowest():
    assert stats.spread([2.0, 3.0, 2.5]) == 1.5
