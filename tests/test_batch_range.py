"""--batch-range: the global batch sizes the search may try, in place of a quarter to eight
times the model file's batch_size (issue 30's range the user allows)."""
from __future__ import annotations

import pytest

from autotune.config import TrialConfig
from autotune.errors import UsageError
from autotune.options import RunOptions, parse_batch_range
from autotune.space import build_space

from doubles import NamedStandIn, StandInRunner, recorded_machine, tune_stand_in
from helpers import knob_cnn


def test_the_range_gives_its_powers_of_two_its_ends_and_the_users_batch_within_it():
    space = build_space(recorded_machine("avx2_epyc"), baseline_batch=48, batch_range=(24, 1000))
    assert space.choices["batch_size"] == [24, 32, 48, 64, 128, 256, 512, 1000]
    assert "outside --batch-range 24-1000" in space.excluded.values()
    default = build_space(recorded_machine("avx2_epyc"), baseline_batch=48)
    assert default.choices["batch_size"] == [16, 32, 48, 64, 128, 256, 512]  # about a quarter to 8x, as before


def test_the_range_stops_at_the_dataset():
    space = build_space(recorded_machine("avx2_epyc"), baseline_batch=16, dataset_len=300, batch_range=(16, 4096))
    assert space.choices["batch_size"] == [16, 32, 64, 128, 256]
    assert space.excluded["batch_size>300"] == "larger than the dataset"


@pytest.mark.parametrize("text", ["16", "16-", "a-b", "64-16", "0-8", "16-1024-2"])
def test_a_range_that_is_not_low_dash_high_is_refused_with_an_example(text):
    with pytest.raises(UsageError, match=r"--batch-range .*expected LOW-HIGH.*e\.g\. --batch-range 16-1024"):
        parse_batch_range(text)


def test_a_range_and_a_pinned_batch_contradict_each_other():
    assert parse_batch_range(" 16-1024 ") == (16, 1024)
    with pytest.raises(UsageError, match="--batch-range and --fix batch_size=32 both set the batch size"):
        RunOptions(batch_range=(16, 1024), fixed={"batch_size": 32})
    with pytest.raises(UsageError, match="--batch-range"):
        RunOptions(batch_range=(64, 16))


def test_the_search_measures_no_batch_outside_the_range_but_the_users_own(tmp_path):
    task = knob_cnn()  # batch_size 16
    runner = StandInRunner(recorded_machine("avx2_epyc"))
    doc = tune_stand_in(task, tmp_path, runner, trials=10, batch_range=(64, 2048))
    assert {c.batch_size for c in runner.measured} - {16} <= {64, 128, 256, 512, 1024, 2048}
    assert any(c.batch_size > 128 for c in runner.measured)  # beyond the old eight times
    assert TrialConfig.from_dict(doc["config"]).batch_size >= 64


def test_a_study_is_not_resumed_over_another_range(tmp_path):
    """Optuna cannot sample a knob whose values changed: the run says so instead of its
    "dynamic value space" error, and names what to do."""
    task = knob_cnn()
    tune_stand_in(task, tmp_path, StandInRunner(recorded_machine("avx2_epyc")), trials=4)
    with pytest.raises(UsageError, match=r"searched other values of batch_size .* another --out"):
        tune_stand_in(task, tmp_path, StandInRunner(recorded_machine("avx2_epyc")), trials=6,
                      batch_range=(64, 2048))
    again = tune_stand_in(task, tmp_path, StandInRunner(recorded_machine("avx2_epyc")), trials=6)
    assert again["verified"]  # the same options resume it


def test_the_ramp_climbs_inside_the_users_range_and_the_search_starts_at_its_fastest(tmp_path):
    """--batch-range 4-2048 from batch 16, on a machine where throughput rises all the way:
    the ramp measures the range's batches from the user's up to the largest the data set
    holds (512; none outside the range), the range searched stays the user's, and the
    search starts a trial at the ramp's fastest batch (a sampler left to find it among
    eight batch sizes may never come near it)."""
    task = knob_cnn()  # batch_size 16
    runner = NamedStandIn(recorded_machine("avx2_epyc"))
    doc = tune_stand_in(task, tmp_path, runner, trials=10, batch_range=(4, 2048))
    ramped = [cfg.batch_size for name, cfg in runner.names if name.startswith("batch-ramp-")]
    assert ramped == [16, 32, 64, 128, 256, 512], ramped
    trials = [cfg for name, cfg in runner.names if name.startswith("trial-")]
    assert 512 in [c.batch_size for c in trials[:3]], [c.batch_size for c in trials]
    assert doc["batch"]["set_by"] == "--batch-range 4-2048" and doc["batch"]["searched"] == [4, 512]
    assert TrialConfig.from_dict(doc["config"]).batch_size == 512


def test_a_shared_studys_ramp_is_measured_once_and_taken_by_the_next_worker(tmp_path):
    """The first worker of a study measures the ramp and stores it; a worker that joins
    before any trial ran takes the stored one and measures nothing, so both search the
    same batch sizes."""
    from autotune.search import batch_range
    from autotune.search.tuner import open_study

    space = build_space(recorded_machine("avx2_epyc"), baseline_batch=16, dataset_len=100_000)
    study = open_study(storage_path=tmp_path / "study.journal", study_name="shared")
    first, second = (NamedStandIn(recorded_machine("avx2_epyc")) for _ in range(2))
    settled = [batch_range.settle(study, space, runner=runner, start=space.baseline, has_evaluate=True,
                                  dataset_len=100_000, limit=None) for runner in (first, second)]
    assert first.names and not second.names
    assert settled[0][0].choices["batch_size"] == settled[1][0].choices["batch_size"]
    assert settled[0][1] == settled[1][1]
