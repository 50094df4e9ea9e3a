"""The gates' short trainings get the time their steps take: a model the search measured at
10 samples/s at its batch of 64 needs 40 numerics steps, 256 s, and more to start; under the
runner's 300-second trial limit its fp32 reference was ended as "still running", and a
memory-bound conv stack verified nothing (exit 3)."""
from __future__ import annotations

import optuna
import pytest

from autotune.config import TrialConfig
from autotune.search.ledger import measured_trials
from autotune.search.trial_summary import TrialSummary
from autotune.trials.protocol import Status, StudyAttr
from autotune.trials.result import TrialResult
from autotune.verify.trainings import Trainings, slowest_rate


class RecordingRunner:
    timeout_s = 300.0

    def __init__(self) -> None:
        self.limits: dict[str, float | None] = {}

    def run(self, cfg, *, name, timeout_s=None, **mode):
        self.limits[name] = timeout_s
        return TrialResult(status=Status.OK)


def test_a_training_slower_than_the_trial_limit_gets_the_time_its_steps_take():
    # the user's configuration with checkpointing, the search's slowest; the reference the
    # gates train (fp32, eager, default threads, with the candidate's memory knobs) ran in
    # no trial, and ran as slow as it
    slow = TrialConfig(batch_size=64, activation_checkpointing=True)
    fast = TrialConfig(batch_size=64, nprocs=1, threads=2, grad_accum=2, activation_checkpointing=True)
    slowest = slowest_rate([(slow, TrialSummary(value=12.0)), (slow.replace(threads=2), TrialSummary(value=9.7)),
                            (fast, TrialSummary(value=400.0)), (fast, TrialSummary())])
    assert slowest == 9.7
    runner = RecordingRunner()
    trainings = Trainings(runner, evaluate=False, numerics_steps=40, slowest=slowest)
    trainings.of(fast.replace(threads=None), "reference")
    trainings.of(TrialConfig(batch_size=4), "small")
    limits = list(runner.limits.values())
    assert limits[0] == 3.0 * 40 * 64 / 9.7 + 120.0  # about 912 s, past the runner's 300
    assert limits[1] is None  # 3 x 40 x 4 / 9.7 + 120 s is within the runner's own limit
    assert Trainings(RecordingRunner(), evaluate=False).limit_s(slow, 40) is None  # no rate known


def test_the_slowest_rate_is_read_from_the_results_the_study_stores():
    """What sizes the gates' limits in a run: the trials' results as the search stored them
    on the study (TrialResult.summary), not a hand-made record."""
    study = optuna.create_study(direction="maximize")
    for cfg, rate in ((TrialConfig(batch_size=64), 12.0), (TrialConfig(batch_size=64, threads=2), 9.7),
                      (TrialConfig(batch_size=16), 400.0)):
        summary = TrialResult(status=Status.OK, value=rate, values=[rate]).summary()
        study.add_trial(optuna.trial.create_trial(
            value=rate, user_attrs={StudyAttr.CONFIG: cfg.to_dict(), StudyAttr.RESULT: summary}))
    assert slowest_rate(measured_trials(study)) == 9.7


def test_a_scored_training_gets_the_time_its_evaluations_take_too():
    """evaluate() took 30 s in the model file's check: a scored training of 100 steps calls it
    4 times (step 0, half, three quarters, the end), the batch check's over the user's samples
    once, a numerics trajectory never; each call is given three times its time, as the steps."""
    cfg = TrialConfig(batch_size=64)
    runner = RecordingRunner()
    trainings = Trainings(runner, evaluate=True, numerics_steps=40, quality_samples=6400, slowest=9.7,
                          evaluate_s=30.0)
    trainings.of(cfg, "scored", scored=True)
    trainings.for_samples(cfg.replace(batch_size=32), "over-samples", samples=6400)
    trainings.of(cfg.replace(threads=2, batch_size=4), "trajectory")
    scored, over_samples, trajectory = runner.limits.values()
    assert scored == pytest.approx(3.0 * (100 * 64 / 9.7 + 4 * 30.0) + 120.0)
    assert over_samples == pytest.approx(3.0 * (200 * 32 / 9.7 + 1 * 30.0) + 120.0)
    assert trajectory is None  # 3 x 40 x 4 / 9.7 + 120 s: within the runner's 300, no evaluate()
    # without a rate from the search, the evaluations alone may pass the runner's limit
    unrated = Trainings(RecordingRunner(), evaluate=True, evaluate_s=30.0)
    assert unrated.limit_s(cfg, 100, evaluations=4) == 3.0 * 4 * 30.0 + 120.0
    assert unrated.limit_s(cfg, 100) is None
