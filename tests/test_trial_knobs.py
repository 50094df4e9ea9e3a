"""Each knob takes effect inside the trial process: real subprocesses, real
rank groups, checked through what the worker itself reports (its setup and step facts)."""
from __future__ import annotations

import os

import psutil
import pytest

from autotune.config import TrialConfig
from autotune.trials.runner import Measurement, TrialRunner

from helpers import MODELS, machine_doc

# Every test here measures real trials, each in its own process tree; one xdist worker
# runs them all, so that each configuration is measured once (README: pytest -n 2).
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("trial_knobs")]

MEASURE = Measurement(warmup_steps=2, window_s=0.2, windows=2)

# Two single-process trials whose knobs all differ, so every knob is seen at two values.
A = TrialConfig(threads=1, batch_size=16, num_workers=0, precision="fp32", affinity="compact")
B = TrialConfig(threads=2, batch_size=32, num_workers=2, precision="bf16", channels_last=True)
DDP = TrialConfig(nprocs=2, threads=1, batch_size=32, backend="gloo")


@pytest.fixture(scope="module")
def trial(tmp_path_factory):
    """trial(cfg) -> its TrialResult; each configuration is measured once per module."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 usable cores")
    runner = TrialRunner(model_file=MODELS / "tiny_cnn.py", machine=machine_doc(),
                         workdir=tmp_path_factory.mktemp("trials"), measurement=MEASURE,
                         timeout_s=150, hang_s=60)
    done = {}

    def run(cfg: TrialConfig):
        if cfg not in done:
            done[cfg] = runner.run(cfg, name=f"trial-{len(done)}")
        result = done[cfg]
        assert result.status == "ok", f"{result.failure}: {result.message}\n{result.log_tail}"
        assert result.setup and result.facts, result.log_tail
        return result

    return run


@pytest.mark.slow
def test_trial_runs_in_its_own_process_and_measures(trial):
    result = trial(A)
    assert result.setup.pid != os.getpid()
    assert result.value and result.value > 0
    assert len(result.values) == MEASURE.windows
    assert all(v > 0 for v in result.values)
    assert result.facts["compiled"] is False
    # forked from a warm interpreter: the imports it skipped, which a standalone run pays
    assert result.preimported_s and result.preimported_s > 0.1
    assert result.summary()["preimported_s"] == result.preimported_s


def test_trial_wall_time_is_split_into_phases(trial):
    """The benchmark's per-trial overhead comes from these: they must add up. (How long
    each phase takes is the machine's business: a window calibrated on slow warm-up steps
    ends early, so nothing here asserts a duration.)"""
    result = trial(A)
    p = result.phases
    assert {"start_import_s", "setup_s", "warmup_s", "measure_s", "overhead_s"} <= set(p), p
    assert all(v >= 0 for v in p.values()), p
    # the measured part is the windows' own time, one figure per window; the rest is overhead
    assert len(result.window_seconds) == MEASURE.windows and all(s > 0 for s in result.window_seconds)
    assert p["measure_s"] == pytest.approx(sum(result.window_seconds), abs=1e-3)
    assert p["measure_s"] + p["overhead_s"] == pytest.approx(result.wall_s, abs=0.01)
    # the phases before measuring happen one after another within the trial's wall time
    assert p["start_import_s"] + p["setup_s"] + p["warmup_s"] + p["measure_s"] <= result.wall_s + 0.01
    assert result.summary()["phases"] == p


@pytest.mark.parametrize("cfg", [A, B], ids=["threads=1", "threads=2"])
@pytest.mark.slow
def test_threads(trial, cfg):
    result = trial(cfg)
    assert result.setup.process.threads == cfg.threads  # torch.get_num_threads() in the trial
    assert result.setup.process.env["OMP_NUM_THREADS"] == str(cfg.threads)


@pytest.mark.parametrize("cfg", [A, B], ids=["batch=16", "batch=32"])
def test_batch_size_one_process(trial, cfg):
    result = trial(cfg)
    assert result.setup.world == 1
    assert result.facts["per_rank_batch"] == cfg.batch_size


@pytest.mark.parametrize("cfg", [A, B], ids=["workers=0", "workers=2"])
def test_num_workers(trial, cfg):
    result = trial(cfg)
    pids = result.facts["loader_worker_pids"]
    assert len(pids) == cfg.num_workers
    assert len(set(pids)) == len(pids) and result.setup.pid not in pids
    # Ending the trial ended its whole tree: no DataLoader worker outlives it.
    alive = [p for p in pids if psutil.pid_exists(p)
             and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert alive == []


def test_precision_fp32(trial):
    assert trial(A).facts["activation_dtypes"] == ["float32"]


def test_precision_bf16_autocast_takes_effect_even_without_native_bf16(trial):
    # The search leaves bf16 out on CPUs without avx512_bf16/AMX, but the runtime must
    # still honour it when asked (a user's --fix, another machine's config).
    dtypes = trial(B).facts["activation_dtypes"]
    assert "bfloat16" in dtypes
    assert result_losses_finite(trial(B))


def test_channels_last(trial):
    assert trial(A).facts["conv_inputs_channels_last"] == [False]
    assert trial(B).facts["conv_inputs_channels_last"] == [True]


def test_affinity_compact_pins_the_rank(trial):
    cpus = machine_doc()["cpu"]["usable_cpus"]
    assert trial(A).setup.process.affinity == cpus[:1]  # one thread, one core
    assert trial(B).setup.process.affinity == cpus      # affinity none: left alone
    assert trial(A).env["TUNED_CPUS_PER_RANK"] == str(cpus[0])


def test_single_process_has_no_ddp(trial):
    result = trial(A)
    assert result.setup.world == 1 and result.setup.backend is None
    assert result.facts["ddp"] is False


@pytest.mark.slow
def test_two_ranks_over_gloo(trial):
    result = trial(DDP)
    assert result.setup.world == 2
    assert result.setup.backend == "gloo"
    assert result.setup.process.threads == 1
    assert result.facts["ddp"] is True
    assert result.facts["per_rank_batch"] == DDP.batch_size // 2
    assert result.value and result.value > 0 and len(result.values) == MEASURE.windows
    # each rank starts as its own command line, importing torch itself
    assert result.preimported_s is None and "preimported_s" not in result.summary()


def result_losses_finite(result) -> bool:
    import math

    return bool(result.losses) and all(math.isfinite(v) for v in result.losses)


# --- a failing trial does not stop the study ----------------------------------------------


QUICK = {"nprocs": 1, "num_workers": 0, "precision": "fp32", "affinity": "none",
         "interop_threads": None}


@pytest.mark.slow
def test_failing_trial_is_recorded_and_the_study_goes_on(tmp_path):
    from optuna.trial import TrialState

    from autotune.search.budget import SearchBudget
    from autotune.search.course import Course, Starts
    from autotune.search.tuner import Tuner, open_study
    from autotune.space import build_space
    from autotune.trials.protocol import Role

    machine = machine_doc()
    # One process and few other knobs: the search is mostly over batch sizes.
    space = build_space(machine, baseline_batch=16, dataset_len=512, fixed=QUICK)
    assert 128 in space.choices["batch_size"]
    assert all(s.startswith("1x") for s in space.choices["layout"])
    runner = TrialRunner(model_file=MODELS / "fails_at_big_batch.py", machine=machine,
                         workdir=tmp_path / "trials", measurement=MEASURE,
                         timeout_s=120, hang_s=60)
    study = open_study(storage_path=tmp_path / "study.journal", study_name="fails-at-big-batch")
    # The failing configuration is enqueued right after the baseline, so it is measured
    # second whatever the sampler draws, and trials still follow it.
    tuner = Tuner(study=study, space=space, runner=runner, course=Course(
        budget=SearchBudget(trials=4), starts=Starts(heuristics=[TrialConfig(threads=1, batch_size=128)])))
    outcome = tuner.run()

    measured = [t for t in study.get_trials()
                if t.state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
                and t.user_attrs.get("duplicate_of") is None and not t.user_attrs.get("skipped")]
    assert len(measured) == 4  # the study ran to its budget

    failed = [t for t in measured if t.user_attrs["config"]["batch_size"] >= 128]
    assert failed, "the failing configuration was never measured"
    for t in failed:
        assert t.state == TrialState.FAIL
        assert t.user_attrs["failure"] == "user_error"
        assert "Picky cannot take a batch of 128 rows" in t.user_attrs["result"]["message"]
    first_failure = min(t.number for t in failed)
    assert any(t.number > first_failure for t in measured), "nothing ran after the failure"

    others = [t for t in measured if t not in failed]
    assert others and all(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in others)
    baseline = [t for t in measured if t.user_attrs.get("role") == Role.BASELINE]
    assert len(baseline) == 1 and baseline[0].state == TrialState.COMPLETE
    assert outcome.baseline is not None and outcome.baseline.value > 0
    assert {f.failure for f in outcome.failures} == {"user_error"}
    assert all(c.config.batch_size < 128 for c in outcome.ranked)


class _StubRunner:
    """Stands in for TrialRunner: every trial 'measures' instantly; the baseline (default
    threads, which are 2 here as the worker would report) is the fastest."""

    timeout_s = 300.0

    def __init__(self) -> None:
        self.configs: list[TrialConfig] = []

    def run(self, cfg, *, name, on_window=None, **_):
        from autotune.trials.logs import read_event
        from autotune.trials.runner import TrialResult

        self.configs.append(cfg)
        value = 100.0 if cfg.threads is None else 50.0
        return TrialResult(status="ok", value=value, values=[value, value],
                           setup=read_event({"e": "setup", "threads": cfg.threads or 2, "world": 1}))


# Regression guard: the best trial is the baseline (threads=None) and the layout of the
# threads it ran with (1x2) is not in the space (threads pinned to 1).
def test_study_with_pinned_threads_survives_a_fastest_baseline(tmp_path):
    from autotune.search.budget import SearchBudget
    from autotune.search.course import Course
    from autotune.search.tuner import Tuner, open_study
    from autotune.space import build_space

    space = build_space(machine_doc(), baseline_batch=16, dataset_len=512,
                        fixed={**QUICK, "threads": 1})
    assert space.choices["layout"] == ["1x1"]
    runner = _StubRunner()
    study = open_study(storage_path=tmp_path / "study.journal", study_name="pinned-threads")
    Tuner(study=study, space=space, runner=runner, course=Course(budget=SearchBudget(trials=3))).run()
    assert len(runner.configs) == 3
    assert runner.configs[0] == space.baseline
