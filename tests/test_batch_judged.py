"""The global batch judged by the machine and by evaluate() (issue 30): the batch range
grows while throughput rises, and a batch that is not the user's must train as well over
the same samples."""
from __future__ import annotations

import dataclasses
import math

import pytest

from autotune.config import TrialConfig
from autotune.document.batch import BatchChoice
from autotune.search import batch_range
from autotune.search.memory import MemoryLimit
from autotune.trials.runner import Measurement, TrialResult, TrialRunner
from autotune.verify.batch import batch_check
from autotune.verify.trainings import Trainings

from doubles import StandInRunner, recorded_machine, tune_stand_in
from helpers import MODELS, knob_cnn

SHORT = Measurement(window_s=0.2, windows=2)


class Rising(StandInRunner):
    """Throughput grows with the square root of the batch up to ``knee``, flat beyond; with
    ``hurts`` over the same samples a batch more than four times the user's learns less,
    unless its learning rate grows with it."""

    def __init__(self, doc: dict, *, knee: int, hurts: bool = False) -> None:
        super().__init__(doc)
        self.knee, self.hurts = knee, hurts
        self.ramped: list[int] = []

    def throughput(self, cfg: TrialConfig) -> float:
        return super().throughput(cfg.replace(batch_size=16)) * math.sqrt(min(cfg.batch_size, self.knee) / 16)

    def run(self, cfg, *, name, on_window=None, trajectory_steps=None, quality_steps=None, **kw):
        if name.startswith("batch-ramp"):
            self.ramped.append(cfg.batch_size)
        result = super().run(cfg, name=name, on_window=on_window, trajectory_steps=trajectory_steps,
                             quality_steps=quality_steps)
        if quality_steps is not None and self.hurts and cfg.batch_size / 16 / cfg.lr_factor > 4:
            result.done = dataclasses.replace(result.done, metric=0.6)
        return result


def test_the_ramp_stops_where_throughput_stops_rising_and_searches_one_step_beyond():
    runner = Rising(recorded_machine("avx2_epyc"), knee=256)
    found = batch_range.ramp(runner, TrialConfig(batch_size=16), most=16 * 1024, limit=None)
    assert [b for b, _ in found.rates] == [16, 32, 64, 128, 256, 512, 1024]  # two steps without a rise
    assert found.top == 512 and found.stopped == "throughput stopped rising after batch 256"
    assert found.fastest is not None and found.fastest[0] == 256


def test_the_ramp_stops_where_memory_binds():
    class OutOfMemoryAt(Rising):
        def run(self, cfg, **kw):
            if cfg.batch_size >= 128:
                return TrialResult(status="failed", failure="out_of_memory", message="CUDA out of memory")
            result = super().run(cfg, **kw)
            result.done = dataclasses.replace(result.done, rank_peak_mb=cfg.batch_size * 10.0)
            return result

    runner = OutOfMemoryAt(recorded_machine("avx2_epyc"), knee=4096)
    found = batch_range.ramp(runner, TrialConfig(batch_size=16), most=16 * 1024, limit=None)
    assert found.top == 64 and found.stopped == "batch 128 ran out of memory"
    limited = batch_range.ramp(runner, TrialConfig(batch_size=16), most=16 * 1024,
                               limit=MemoryLimit(user_mb=500))
    assert limited.top == 32 and "over the --memory-limit" in limited.stopped


def test_with_evaluate_the_search_reaches_batches_beyond_eight_times_and_emits_one(tmp_path):
    """knob_cnn.py: batch 16, 512 samples, evaluate(): the ramp goes to the data set."""
    runner = Rising(recorded_machine("avx2_epyc"), knee=4096)
    doc = tune_stand_in(knob_cnn(), tmp_path, runner, trials=10)
    assert runner.ramped == [16, 32, 64, 128, 256, 512]
    assert doc["space"]["included"]["batch_size"][-1] == 512  # the old range stopped at 128
    assert doc["config"]["batch_size"] > 128, doc["config"]
    batch = doc["batch"]
    assert batch["searched"] == [4, 512] and "over the most tried (512)" in batch["set_by"]
    assert f"batch {doc['config']['batch_size']} with your learning rate: evaluate()" in batch["check"]


def test_a_resumed_study_keeps_the_range_it_was_searched_over(tmp_path):
    task = knob_cnn()
    tune_stand_in(task, tmp_path, Rising(recorded_machine("avx2_epyc"), knee=64), trials=4)
    again = Rising(recorded_machine("avx2_epyc"), knee=4096)  # the machine would say otherwise now
    doc = tune_stand_in(task, tmp_path, again, trials=6)
    assert again.ramped == [] and doc["space"]["included"]["batch_size"][-1] == 128


def test_a_pinned_batch_is_not_ramped_and_a_given_range_only_inside_it(tmp_path):
    task = knob_cnn()
    runner = Rising(recorded_machine("avx2_epyc"), knee=4096)
    (tmp_path / "fixed").mkdir()
    (tmp_path / "range").mkdir()
    doc = tune_stand_in(task, tmp_path / "fixed", runner, trials=4, fixed={"batch_size": 16})
    assert runner.ramped == [] and doc["batch"]["set_by"] == "--fix batch_size=16"
    doc = tune_stand_in(task, tmp_path / "range", runner, trials=4, batch_range=(8, 64))
    assert runner.ramped == [16, 32, 64] and doc["batch"]["set_by"] == "--batch-range 8-64"
    assert doc["space"]["included"]["batch_size"] == [8, 16, 32, 64]


def test_without_evaluate_the_batch_stays_within_eight_times_and_a_faster_one_is_named(tmp_path):
    """Without evaluate() nothing can check a larger batch, so none is tried beyond eight
    times the user's, and the summary says what the machine ran faster."""
    task = dataclasses.replace(knob_cnn(), has_evaluate=False)  # batch 16
    runner = Rising(recorded_machine("avx2_epyc"), knee=4096)
    doc = tune_stand_in(task, tmp_path, runner, trials=8)
    assert runner.ramped == [16, 32, 64, 128, 256]  # one step beyond 128, to know
    assert doc["space"]["included"]["batch_size"] == [4, 8, 16, 32, 64, 128]
    assert doc["config"]["batch_size"] <= 128
    unchecked = doc["batch"]["unchecked"]
    assert unchecked.startswith("a larger batch was faster but unchecked: batch 256 ran "), unchecked
    # how much faster than the user's configuration, and the flag that would allow it
    assert "x your speed" in unchecked and "--batch-range 4-256" in unchecked and "evaluate()" in unchecked


def test_a_larger_batch_that_learns_less_is_rejected_with_both_metrics_and_linear_scaling_rescues_it(tmp_path):
    task = knob_cnn()
    runner = Rising(recorded_machine("avx2_epyc"), knee=4096, hurts=True)
    for name in ("none", "linear"):
        (tmp_path / name).mkdir()
    doc = tune_stand_in(task, tmp_path / "none", runner, trials=10)
    assert doc["config"]["batch_size"] <= 64, doc["config"]
    rejected = doc["batch"]["rejected"]
    assert rejected and all(int(b) > 64 for b in rejected)
    reason = next(iter(rejected.values()))
    assert "evaluate() 0.6 after" in reason and "against 0.9 at your batch 16" in reason
    summary = BatchChoice.from_json(doc["batch"]).lines()  # what the summary and report.md print
    assert any(line.strip().startswith(f"rejected batch {b}: ") and "evaluate() 0.6" in line
               and "against 0.9" in line for line in summary for b in rejected), summary
    scaled = Rising(recorded_machine("avx2_epyc"), knee=4096, hurts=True)
    doc = tune_stand_in(task, tmp_path / "linear", scaled, trials=10, scale_lr="linear")
    assert doc["config"]["batch_size"] > 64 and not doc["batch"]["rejected"], doc["batch"]
    assert "--scale-lr linear" in doc["batch"]["check"]


@pytest.mark.slow
def test_real_trainings_reject_a_larger_batch_at_the_users_learning_rate_and_accept_it_scaled(tmp_path):
    """slow_learner.py: SGD whose learning rate suits batch 16; at batch 256 over the same
    10,240 samples (its 40 steps) it takes 40 steps instead of 640."""
    runner = TrialRunner(model_file=MODELS / "slow_learner.py", machine={}, workdir=tmp_path, measurement=SHORT)
    trainings = Trainings(runner, evaluate=True)
    user = TrialConfig(batch_size=16, lr_batch=16)
    check = batch_check(trainings, user, user.replace(batch_size=256), max_drop=None)
    assert check.passed is False, check.detail
    assert check.detail["samples"] == 40 * 256 and check.detail["candidate_steps"] == 40
    assert check.detail["reference_metric"] > 0.99 > 0.95 > check.detail["candidate_metric"]
    assert "evaluate()" in check.reason and "at your batch 16" in check.reason
    linear = user.replace(lr_scaling="linear")
    check = batch_check(trainings, linear, linear.replace(batch_size=256), max_drop=None)
    assert check.passed, check.detail
    assert check.detail["candidate_metric"] > 0.99 and check.detail["lr_factor"] == 16


def test_the_ramp_measures_in_short_windows_whatever_the_search_uses_and_gives_them_back():
    """A user's --window 30 is for the search: the ramp only finds a range."""
    class Recording(Rising):
        measurement = Measurement(window_s=30.0, windows=5)

        def run(self, cfg, **kw):
            self.seen = getattr(self, "seen", []) + [self.measurement]
            return super().run(cfg, **kw)

    runner = Recording(recorded_machine("avx2_epyc"), knee=64)
    batch_range.ramp(runner, TrialConfig(batch_size=16), most=1024, limit=None)
    assert {(m.window_s, m.windows) for m in runner.seen} == {(1.0, 3)}
    assert (runner.measurement.window_s, runner.measurement.windows) == (30.0, 5)


def test_the_ramp_starts_no_step_after_its_share_of_the_timeout():
    runner = Rising(recorded_machine("avx2_epyc"), knee=4096)
    found = batch_range.ramp(runner, TrialConfig(batch_size=16), most=16 * 1024, limit=None, for_s=0.0)
    assert runner.ramped == [16] and found.stopped == "its share of --timeout was spent at batch 16"


def test_the_default_range_kept_after_an_early_flat_stops_at_the_dataset(tmp_path):
    """A throughput that stops rising early keeps eight times the user's batch, but never a
    batch larger than the data set."""
    task = dataclasses.replace(knob_cnn(), dataset_len=64)  # batch 16
    runner = Rising(recorded_machine("avx2_epyc"), knee=16)
    doc = tune_stand_in(task, tmp_path, runner, trials=4)
    assert runner.ramped == [16, 32, 64]
    assert doc["space"]["included"]["batch_size"] == [4, 8, 16, 32, 64]
    assert doc["space"]["excluded"]["batch_size>64"] == "larger than the dataset"


def test_the_ramp_has_its_share_of_the_timeout_from_its_own_start(monkeypatch):
    """What ran before it (the probe, the model file's check) does not shorten the ramp:
    each step here takes 4 s of a clock that read 1,000 s when the ramp began."""
    clock = [1000.0]
    monkeypatch.setattr(batch_range.time, "time", lambda: clock[0])

    class Slow(Rising):
        def run(self, cfg, **kw):
            clock[0] += 4.0
            return super().run(cfg, **kw)

    runner = Slow(recorded_machine("avx2_epyc"), knee=4096)
    found = batch_range.ramp(runner, TrialConfig(batch_size=16), most=16 * 1024, limit=None, for_s=10.0)
    assert runner.ramped == [16, 32, 64], found.stopped
    assert found.stopped == "its share of --timeout was spent at batch 64"


def test_on_a_gpu_the_ramp_stops_where_device_memory_is_nearly_full():
    """Each sample holds 10 MiB beside 2 GiB of weights on an 80 GiB GPU: from its first two
    batches' peaks the ramp jumps to the largest batch whose peak stays within 90% of it, and
    stops there, without running out of memory (throughput rises all the way here: the batches
    between are measured to find where it stops rising)."""
    class Filling(Rising):
        def measured_done(self, cfg):
            return {**super().measured_done(cfg), "cuda_peak_mb": 2048.0 + 10.0 * cfg.batch_size,
                    "cuda_total_mb": 81559.0}

    runner = Filling(recorded_machine("h100x1"), knee=1 << 20)
    start = TrialConfig(batch_size=64, device="cuda", backend="nccl")
    found = batch_range.ramp(runner, start, most=64 * 1024, limit=None)
    assert runner.ramped[:3] == [64, 128, 4096], runner.ramped  # 8192 would need about 84 GiB
    assert max(runner.ramped) == 4096 and found.knee == 4096 and found.top == 4096
    assert found.memory_bound and found.stopped.startswith("device memory is nearly full at batch 4096")


def test_on_a_gpu_without_evaluate_the_ramp_climbs_to_the_knee_and_names_it():
    """Without evaluate() the search stays within eight times the user's batch; on a GPU
    the ramp still climbs to where throughput stops rising (a CPU's stops one step beyond
    what may be emitted), and the summary names the faster batch with the flag that allows it."""
    assert batch_range.most_tried(16, dataset_len=None, has_evaluate=False) == 256
    assert batch_range.most_tried(16, dataset_len=None, has_evaluate=False, gpu=True) == 16 * 1024
    assert batch_range.most_tried(16, dataset_len=60_000, has_evaluate=False, gpu=True) == 16 * 1024
