"""A trial that profiles instead of measuring (``TrialRunner.run(profile=True)``): it warms up
as a measurement does, then runs one window of about a second under torch.profiler, and
reports where the step went (``TrialResult.step_profile``) in its DONE line. The line and
the spec read back; the stand-ins report the profile they are given, none by default; a
real trial of a tiny CNN profiles its step."""
from __future__ import annotations

import pytest

from autotune.config import TrialConfig
from autotune.runtime.shares import Category
from autotune.runtime.step_profile import StepProfile
from autotune.trials.events import DoneEvent
from autotune.trials.logs import read_event
from autotune.trials.protocol import Measurement, Mode
from autotune.trials.result import TrialResult
from autotune.trials.runner import TrialRunner
from autotune.trials.spec import TrialMode, TrialSpec

from doubles import StandInRunner, recorded_machine
from helpers import MODELS


def _profile(**shares: float) -> StepProfile:
    full = {c.value: 0.0 for c in Category}
    full.update(shares)
    return StepProfile(step_ms=3.0, steps=12, device="cpu", source="cpu ops", shares=full, measured_step_ms=3.1)


def test_a_profiled_trials_done_line_reads_back_with_its_profile_and_no_measurement():
    profile = _profile(convolution=0.7, matmul=0.1, other=0.2)
    done = DoneEvent(mode=Mode.PROFILE, step_profile=profile, samples_per_s=512.0)
    line = done.to_json()
    assert line["step_profile"] == profile.to_json() and line["samples_per_s"] == 512.0
    assert "value" not in line and "metric" not in line
    read = read_event(line)
    assert read == done
    result = TrialResult(status="ok", done=read)
    assert result.step_profile == profile and result.value is None
    assert result.summary()["step_profile"] == profile.to_json()
    # a profiled window that reported none (a rank other than 0's line), and any other run
    assert read_event(DoneEvent(mode=Mode.PROFILE).to_json()) == DoneEvent(mode=Mode.PROFILE)
    assert TrialResult(status="ok", done=DoneEvent(value=1.0, values=[1.0])).step_profile is None
    assert "step_profile" not in TrialResult(status="ok").summary()


def test_a_profiled_trials_spec_names_its_mode():
    spec = TrialSpec(model_file="m.py", config=TrialConfig().to_dict(), events="e", mode=TrialMode.profile())
    assert spec.to_json()["mode"] == "profile"
    assert TrialSpec.from_json(spec.to_json()).mode == TrialMode(Mode.PROFILE)


def test_the_runner_starts_a_profiled_trial_in_profile_mode(tmp_path, monkeypatch):
    runner = TrialRunner(model_file=MODELS / "tiny_cnn.py", machine={}, workdir=tmp_path)
    seen = []

    class Done:
        def wait(self):
            return TrialResult(status="ok")

    def start(cfg, *, name, mode=None, **kw):
        seen.append(mode)
        return Done()

    monkeypatch.setattr(runner, "start", start)
    runner.run(TrialConfig(), name="p", profile=True)
    runner.run(TrialConfig(), name="m")
    assert seen == [TrialMode.profile(), TrialMode()]
    with pytest.raises(ValueError, match="either profiles"):
        runner.run(TrialConfig(), name="both", profile=True, trajectory_steps=3)


def test_a_stand_in_reports_the_profile_it_is_given_and_none_by_default():
    cfg = TrialConfig(batch_size=16)
    plain = StandInRunner(recorded_machine("avx2_epyc"))
    result = plain.run(cfg, name="p", profile=True)
    assert result.status == "ok" and result.step_profile is None and result.value is None
    assert plain.profiled == [cfg] and plain.measured == []
    assert plain.run(cfg, name="m").step_profile is None

    profile = _profile(data_wait=0.6, other=0.4)
    given = StandInRunner(recorded_machine("avx2_epyc"), profiles=lambda c: profile if c.batch_size == 16 else None)
    assert given.run(cfg, name="p", profile=True).step_profile == profile
    assert given.run(cfg.replace(batch_size=32), name="q", profile=True).step_profile is None


@pytest.mark.slow
def test_a_real_trial_profiles_its_step_into_shares_that_add_up(tmp_path):
    """tiny_cnn.py on one thread: the profiled window's shares add up to the step, the
    convolution and the optimizer show, and nothing is reported as a measurement."""
    runner = TrialRunner(model_file=MODELS / "tiny_cnn.py", machine={}, workdir=tmp_path,
                         measurement=Measurement(warmup_steps=2, window_s=0.2, windows=2), timeout_s=180)
    try:
        result = runner.run(TrialConfig(threads=1, batch_size=16), name="profiled", profile=True)
    finally:
        runner.shutdown()
    assert result.status == "ok", (result.failure, result.message, result.log_tail)
    profile = result.step_profile
    assert isinstance(profile, StepProfile)
    assert profile.device == "cpu" and profile.source == "cpu ops" and profile.steps >= 5
    assert profile.step_ms > 0 and profile.measured_step_ms is not None and profile.measured_step_ms > 0
    assert sum(profile.shares.values()) == pytest.approx(1.0, abs=1e-3)
    assert profile.share(Category.CONVOLUTION) > 0 and profile.share(Category.OPTIMIZER) > 0
    assert result.value is None and result.values == []
    assert result.done is not None and result.done.samples_per_s is not None and result.done.samples_per_s > 0
    assert result.warmup is not None and result.warmup.step_s > 0  # it warmed up as a measurement does
