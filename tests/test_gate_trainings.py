"""The gates' short trainings get the time their steps take: a model the search measured at
10 samples/s at its batch of 64 needs 40 numerics steps, 256 s, and more to start; under the
runner's 300-second trial limit its fp32 reference was ended as "still running", and a
memory-bound conv stack verified nothing (exit 3)."""
from __future__ import annotations

import optuna

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
