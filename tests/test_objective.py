"""The time-to-train objective (--train-steps, --epochs): the planned run's predicted time
ranks the search and verification, and the report says after how many steps compiling
pays for itself."""
from __future__ import annotations

import math

import pytest
from optuna.trial import TrialState

from autotune import schemas
from autotune.cli import main
from autotune.config import TrialConfig
from autotune.document.measures import Check
from autotune.document.run import RunDocument
from autotune.errors import UsageError
from autotune.options import RunOptions
from autotune.report.advice import advise
from autotune.search.study import load_study
from autotune.task.objective import Measured, PlannedRun, Pricing, break_even, break_evens
from autotune.verify.speed import CandidateSpeed, plan_check
from autotune.verify.stats import ratio_interval
from autotune.verify.verdict import Verdict, rank_by_rounds

from doubles import StandInRunner, recorded_machine, tune_stand_in
from helpers import MODELS, knob_cnn

COMPILE_S = 60.0  # what compiling costs once, in the model below
COMPILED_SPEED = 1.25  # compiled, a step takes 80% of the eager one's time


class CompileWinsLong(StandInRunner):
    """Compiling costs a minute once and saves a fifth of every step: it wins long runs only."""

    def throughput(self, cfg: TrialConfig) -> float:
        eager = super().throughput(cfg.replace(compile="off"))
        return eager * COMPILED_SPEED if cfg.compile != "off" else eager

    def one_time_s(self, cfg: TrialConfig) -> float:
        return COMPILE_S if cfg.compile != "off" else 0.0


@pytest.fixture(scope="module")
def task():
    return knob_cnn()


# --- the arithmetic --------------------------------------------------------------------


def test_a_plan_counts_steps_at_the_users_batch_and_epochs_over_the_data_set():
    steps = PlannedRun.of(train_steps=1000, epochs=None, batch_size=32, dataset_len=None)
    assert steps is not None and steps.samples == 32_000 and steps.steps == 1000
    epochs = PlannedRun.of(train_steps=None, epochs=3, batch_size=32, dataset_len=5000)
    assert epochs is not None and epochs.samples == 15_000
    assert PlannedRun.of(train_steps=None, epochs=None, batch_size=32, dataset_len=5000) is None
    assert PlannedRun.from_json(epochs.to_json()) == epochs


def test_the_predicted_time_is_the_one_time_cost_plus_the_samples_at_the_steady_rate():
    plan = PlannedRun(samples=10_000, batch_size=10)
    assert plan.predicted_s(samples_per_s=100.0, one_time_s=30.0) == pytest.approx(130.0)
    assert plan.effective(samples_per_s=100.0, one_time_s=30.0) == pytest.approx(10_000 / 130.0)
    # an endless run: the effective throughput is the throughput
    endless = PlannedRun(samples=10**15, batch_size=10)
    assert endless.effective(samples_per_s=100.0, one_time_s=30.0) == pytest.approx(100.0)


def test_break_even_is_the_extra_one_time_cost_over_the_time_saved_a_step():
    eager = Measured(config=TrialConfig(batch_size=50), samples_per_s=1000.0, one_time_s=2.0)
    compiled = Measured(config=TrialConfig(batch_size=50, compile="default"), samples_per_s=1250.0,
                        one_time_s=42.0)
    found = break_even(compiled, eager)
    # a step: 50 ms eager, 40 ms compiled; 40 s more at the start
    assert found.one_time_s == pytest.approx(40.0) and found.saved_per_step_s == pytest.approx(0.010)
    assert found.steps == pytest.approx(4000.0)
    assert found.line() == ("compile=default pays off after 4,000 steps: 40 s of compiling, 10 ms saved "
                            "a step (on layout=1xdefault batch=50)")
    assert "after 4,000 steps of batch 50: 40 s of compiling, 10 ms saved a step; the planned run has 640 " \
        in found.line(plan=PlannedRun(samples=32_000, batch_size=32))

    slower = Measured(config=compiled.config, samples_per_s=900.0, one_time_s=42.0)
    never = break_even(slower, eager)
    assert never.steps is None and "never pays off: not faster per step" in never.line()
    lonely = break_evens([compiled])
    assert lonely[0].twin is None and "was not measured" in lonely[0].line()


def test_epochs_need_a_data_set_with_a_length():
    with pytest.raises(UsageError, match="--train-steps"):
        PlannedRun.of(train_steps=None, epochs=2, batch_size=16, dataset_len=None)


def test_epochs_of_a_stream_are_refused_before_anything_is_created(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["run", str(MODELS / "token_stream.py"), "--out", str(out), "--epochs", "1"]) != 0
    assert "--train-steps" in capsys.readouterr().err and not out.exists()


# --- the options -----------------------------------------------------------------------


@pytest.mark.parametrize("options", [dict(train_steps=0), dict(epochs=-1), dict(train_steps=2.5),
                                     dict(epochs=True), dict(train_steps=10, epochs=2)])
def test_a_plan_that_is_not_one_positive_count_is_refused(options):
    with pytest.raises(UsageError, match="--train-steps|--epochs"):
        RunOptions(**options)


def test_the_cli_refuses_both_plans_at_once_and_a_count_that_is_not_positive(tmp_path, capsys):
    model = str(MODELS / "knob_cnn.py")
    assert main(["run", model, "--out", str(tmp_path / "o"), "--train-steps", "10", "--epochs", "2"]) != 0
    assert "--train-steps and --epochs" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()  # refused before anything ran
    with pytest.raises(SystemExit):
        main(["run", model, "--train-steps", "0"])
    assert "--train-steps must be positive" in capsys.readouterr().err


def test_the_api_takes_the_plan_by_keyword(tmp_path):
    import autotune

    with pytest.raises(UsageError, match="--train-steps and --epochs"):
        autotune.tune(MODELS / "knob_cnn.py", out=tmp_path / "o", train_steps=10, epochs=1, progress=False)


# --- verification's ranking ------------------------------------------------------------


def _served(cfg: TrialConfig, rate: float, base: float) -> Verdict:
    rates = [rate * (1 + 0.01 * (i % 3)) for i in range(5)]
    ratios = [r / base for r in rates]
    speed = CandidateSpeed(interval=ratio_interval(ratios), ratios=tuple(ratios), samples_per_s=tuple(rates),
                           median_samples_per_s=rate)
    return Verdict(cfg, {"speed": Check(True, speed.to_json())}, speed)


def test_verification_ranks_by_the_planned_run_with_the_searchs_one_time_costs():
    baseline, eager = TrialConfig(batch_size=50), TrialConfig(batch_size=50, num_workers=2)
    compiled = eager.replace(compile="default")
    measured = (Measured(config=baseline, samples_per_s=1000.0, one_time_s=2.0),
                Measured(config=eager, samples_per_s=1100.0, one_time_s=2.0),
                Measured(config=compiled, samples_per_s=1375.0, one_time_s=62.0))

    def ranked(samples: int) -> list[TrialConfig]:
        verdicts = [_served(compiled, 1375.0, 1000.0), _served(eager, 1100.0, 1000.0)]
        pricing = Pricing(plan=PlannedRun(samples=samples, batch_size=50), measured=measured)
        return [v.config for v in rank_by_rounds(verdicts, pricing)]

    assert [v.config for v in rank_by_rounds(
        [_served(eager, 1100.0, 1000.0), _served(compiled, 1375.0, 1000.0)])] == [compiled, eager]
    assert ranked(10_000) == [eager, compiled]  # 60 s of compiling to save 2 s
    assert ranked(10_000_000) == [compiled, eager]


def test_a_candidate_faster_per_step_but_slower_over_the_planned_run_fails_the_plan_check():
    baseline, compiled = TrialConfig(batch_size=50), TrialConfig(batch_size=50, compile="default")
    pricing = Pricing(plan=PlannedRun(samples=10_000, batch_size=50),
                      measured=(Measured(config=baseline, samples_per_s=1000.0, one_time_s=2.0),
                                Measured(config=compiled, samples_per_s=1250.0, one_time_s=62.0)))
    speed = CandidateSpeed.from_check(_served(compiled, 1250.0, 1000.0).checks["speed"])
    check = plan_check(pricing, compiled, speed, baseline=baseline, base_rate=1000.0)
    assert check.passed is False and "slower than the baseline over the planned run" in check.reason
    long = Pricing(plan=PlannedRun(samples=10_000_000, batch_size=50), measured=pricing.measured)
    assert plan_check(long, compiled, speed, baseline=baseline, base_rate=1000.0).passed


# --- the whole run, on a model where compiling wins long runs only ----------------------


def modelled_break_even(cfg: TrialConfig, runner: CompileWinsLong) -> float:
    """Steps of ``cfg``'s batch after which its compiling has paid for itself, as modelled."""
    eager = runner.throughput(cfg.replace(compile="off"))
    return COMPILE_S / (cfg.batch_size / eager - cfg.batch_size / (eager * COMPILED_SPEED))


def test_a_short_planned_run_emits_eager_and_a_long_one_compiled(task, tmp_path, capsys):
    (tmp_path / "short").mkdir()
    (tmp_path / "long").mkdir()
    short_runner = CompileWinsLong(recorded_machine("avx2_epyc"))
    short = tune_stand_in(task, tmp_path / "short", short_runner, trials=12, train_steps=200)
    long_runner = CompileWinsLong(recorded_machine("avx2_epyc"))
    long = tune_stand_in(task, tmp_path / "long", long_runner, trials=12, train_steps=10_000_000)

    assert short["verified"] and short["config"]["compile"] == "off"
    assert long["verified"] and long["config"]["compile"] != "off"
    # the search measured compiled configurations in both; only the long run ranks them first
    assert any(c.compile != "off" for c in short_runner.measured)
    assert short["plan"]["train_steps"] == 200 and short["plan"]["samples"] == 200 * task.batch_size
    assert short["plan"]["chosen"]["predicted_s"] < short["plan"]["baseline"]["predicted_s"]

    compiled = [c for c in long_runner.measured if c.compile != "off"]
    entries = long["plan"]["break_even"]
    assert {TrialConfig.from_dict(b["config"]) for b in entries} == set(compiled)
    for entry in entries:
        assert entry["twin"] is not None and entry["one_time_s"] == pytest.approx(COMPILE_S)
        assert entry["steps"] == pytest.approx(modelled_break_even(TrialConfig.from_dict(entry["config"]),
                                                                   long_runner))
    assert long["config"]["compile"] in {b["compile"] for b in entries}
    assert long["plan"]["chosen"]["one_time_s"] == pytest.approx(COMPILE_S)
    modelled = modelled_break_even(TrialConfig.from_dict(entries[0]["config"]), long_runner)

    # the search's values are the planned run's effective throughputs, compiled trials
    # measured to the end (not pruned for their one-time cost)
    study = load_study(tmp_path / "short" / "out")
    done = [t for t in study.trials if t.state == TrialState.COMPLETE and not t.user_attrs.get("duplicate_of")]
    assert any(t.user_attrs["config"]["compile"] != "off" for t in done)
    for t in done:
        assert t.value == pytest.approx(200 * task.batch_size / t.user_attrs["result"]["planned_s"])
    for doc in (short, long):
        assert schemas.problem(doc, "best_config") is None
        assert RunDocument.from_json(doc).to_json() == doc

    assert main(["show", str(tmp_path / "long" / "out"), "--details"]) == 0
    shown = capsys.readouterr().out
    assert f"pays off after {math.ceil(modelled):,} steps of batch {entries[0]['config']['batch_size']}: " \
           "60 s of compiling" in shown
    assert "with the emitted configuration" in shown
    report = (tmp_path / "long" / "out" / "report.md").read_text()
    assert f"pays off after {math.ceil(modelled):,} steps" in report and "planned run" in report


def test_a_compiled_candidate_slower_over_the_planned_run_than_the_baseline_is_not_emitted(task, tmp_path):
    class OnlyCompilePays(CompileWinsLong):
        def throughput(self, cfg: TrialConfig) -> float:
            return 1000.0 * (COMPILED_SPEED if cfg.compile != "off" else 1.0)

    doc = tune_stand_in(task, tmp_path, OnlyCompilePays(recorded_machine("avx2_epyc")), trials=12,
                        train_steps=200, top=20)
    assert not doc["verified"] and doc["config"] == doc["baseline"]["config"]
    compiled = [r for r in doc["rejected"] if r["config"]["compile"] != "off"]
    assert compiled and all(r["checks"]["speed"]["passed"] for r in compiled)
    assert all("slower than the baseline over the planned run" in r["reason"] for r in compiled)
    assert "predicted to take" in " ".join(advise(RunDocument.from_json(doc)))


def test_verification_tries_the_shortest_planned_run_first_not_the_fastest_step(task, tmp_path):
    class WorkersOrCompile(CompileWinsLong):
        def throughput(self, cfg: TrialConfig) -> float:
            return (1000.0 * (1.2 if cfg.num_workers else 1.0)
                    * (COMPILED_SPEED if cfg.compile != "off" else 1.0))

    # 272,000 samples: the baseline 272 s, DataLoader workers 227 s, workers and compiling
    # 60 s + 181 s: compiling beats the baseline over this run, but not the eager workers
    doc = tune_stand_in(task, tmp_path, WorkersOrCompile(recorded_machine("avx2_epyc")), trials=12,
                        train_steps=17_000, top=20)
    assert doc["verified"] and doc["config"]["compile"] == "off" and doc["config"]["num_workers"] > 0
    compiled = [c for c in doc["candidates"] if c["config"]["compile"] != "off"]
    assert compiled and all("plan" in c["checks"] and not c["outcome"].startswith("rejected")
                            for c in compiled)


def test_without_a_plan_the_search_ranks_by_steady_throughput(task, tmp_path):
    runner = CompileWinsLong(recorded_machine("avx2_epyc"))
    doc = tune_stand_in(task, tmp_path, runner, trials=12)
    assert doc["config"]["compile"] != "off" and "plan" not in doc
    assert all("planned_s" not in r for r in doc["search"]["ranking"])


def test_epochs_plan_the_data_sets_length(task, tmp_path):
    doc = tune_stand_in(task, tmp_path, CompileWinsLong(recorded_machine("avx2_epyc")), trials=8, epochs=2)
    assert doc["plan"]["epochs"] == 2 and doc["plan"]["samples"] == 2 * task.dataset_len


def test_a_study_resumed_with_another_plan_is_refused(task, tmp_path):
    assert task.dataset_len == 32 * task.batch_size  # 32 steps are one epoch
    tune_stand_in(task, tmp_path, CompileWinsLong(recorded_machine("avx2_epyc")), trials=6, train_steps=64)
    with pytest.raises(UsageError, match="64 steps at batch 16.*this run asks for a planned run of 5,000"):
        tune_stand_in(task, tmp_path, CompileWinsLong(recorded_machine("avx2_epyc")), trials=6,
                      train_steps=5000)
    with pytest.raises(UsageError, match="asks for no planned run"):
        tune_stand_in(task, tmp_path, CompileWinsLong(recorded_machine("avx2_epyc")), trials=6)
    # the same planned samples, said as epochs: the same objective, resumed
    doc = tune_stand_in(task, tmp_path, CompileWinsLong(recorded_machine("avx2_epyc")), trials=6, epochs=2)
    assert doc["plan"]["epochs"] == 2 and doc["search"]["trials"] >= 6
