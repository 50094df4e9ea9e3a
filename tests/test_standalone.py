"""The speedup autotune prints is the one the user measures: the emitted launch.sh
against the baseline's script, each run alone, alternating."""
from __future__ import annotations

import json
import math
import os
import random
import re
import statistics
from pathlib import Path

import pytest

from autotune import pipeline
from autotune.config import TrialConfig
from autotune.document.interval import Interval
from autotune.document.measures import Check, Standalone
from autotune.document.run import RunDocument
from autotune.errors import NotVerified
from autotune.report.console import Reporter
from autotune.reverify import reverify
from autotune.search.task_space import build_task_space
from autotune.search.trial_summary import TrialSummary
from autotune.sections import SearchOptions
from autotune.trials.script_report import ScriptReport
from autotune.verify import sequential, standalone
from autotune.verify.settings import Settings
from autotune.verify.speed import CandidateSpeed, ReferenceSpeed

from doubles import StandInRunner, recorded_machine, tune_stand_in
from helpers import knob_cnn


@pytest.fixture(scope="module")
def task():

    return knob_cnn()


def test_the_printed_speedup_follows_the_standalone_runs_not_the_side_by_side_windows(task, tmp_path):
    doc_in = recorded_machine("avx2_epyc")
    baseline = build_task_space(task, doc_in, SearchOptions.of(pipeline.RunOptions(), task=task)).baseline

    def served(cfg: TrialConfig) -> float:
        # Held side by side, every candidate looks 40% faster than it runs alone.
        return 1.0 if cfg == baseline else 1.4

    runner = StandInRunner(doc_in, served=served)
    doc = tune_stand_in(task, tmp_path, runner)
    assert doc["verified"]
    chosen = TrialConfig.from_dict(doc["config"])
    assert TrialConfig.from_dict(doc["baseline"]["config"]) == baseline
    alone = runner.throughput(chosen) / runner.throughput(baseline)
    assert doc["speedup"]["median"] == pytest.approx(alone)
    assert doc["speedup"]["ci_low"] <= alone <= doc["speedup"]["ci_high"]
    assert doc["best"]["samples_per_s"] == pytest.approx(runner.throughput(chosen))
    assert doc["baseline"]["samples_per_s"] == pytest.approx(runner.throughput(baseline))
    # the stand-in machine is steady: the figure a re-run stays above clears 1x at the fewest pairs
    pairs = sequential.PAIRS_FEWEST
    assert doc["speedup"]["pairs"] == pairs and "each run alone" in doc["speedup"]["covers"]
    assert "settled after 3 pairs" in doc["verification"]["standalone"]["stopped"]
    assert doc["speedup"]["lower_bound"] < alone
    # the side-by-side figure is kept beside it, and it is the inflated one
    assert doc["speedup"]["side_by_side"]["median"] == pytest.approx(1.4 * alone, rel=0.03)
    assert "unsteady" not in doc["speedup"]
    # the scripts ran in pairs: the baseline's and the emitted one's, as many of each
    ran = [json.loads((p.parent / "best_config.json").read_text())["candidate"]
           for p in runner.scripts]
    assert ran.count(baseline.to_dict()) == ran.count(chosen.to_dict()) == pairs


def test_candidates_faster_only_side_by_side_are_not_verified(task, tmp_path):
    doc_in = recorded_machine("avx2_epyc")
    baseline = build_task_space(task, doc_in, SearchOptions.of(pipeline.RunOptions(), task=task)).baseline

    class SlowerAlone(StandInRunner):
        """Held side by side every candidate looks 3x faster than the baseline; run
        alone, each runs at 95% of the baseline's speed."""

        def run_script(self, launcher, **kw):
            if Path(launcher).parent.name == "baseline":
                return super().run_script(launcher, **kw)
            self.scripts.append(Path(launcher))
            return ScriptReport(samples_per_s=0.95 * self.throughput(baseline))

    runner = SlowerAlone(doc_in, served=lambda cfg: 1.0 if cfg == baseline else 3.0)
    doc = tune_stand_in(task, tmp_path, runner)
    assert not doc["verified"] and doc["config"] == baseline.to_dict()
    refused = [c for c in doc["candidates"] if "not faster when run alone" in c["outcome"]]
    assert len(refused) == 2, "the scripts of the two fastest run alone, no more"
    assert all(c["median"] > 2.5 for c in refused), "they did look faster side by side"
    assert any("not run alone" in c["outcome"] for c in doc["candidates"])


def test_a_machine_that_changes_speed_while_measured_is_said_so(task, tmp_path, capsys):
    class SteppedDown(StandInRunner):
        """After its first run the emitted configuration loses 30% of its speed."""

        def run_script(self, launcher, **kw):
            report = super().run_script(launcher, **kw)
            if Path(launcher).parent.name != "baseline":
                runs = sum(1 for p in self.scripts if p.parent.name != "baseline")
                report.samples_per_s *= 0.7 if runs > 1 else 1.0
            return report

    doc = tune_stand_in(task, tmp_path, SteppedDown(recorded_machine("avx2_epyc")))
    assert "this machine's speed changed while it was measured" in doc["speedup"]["unsteady"]
    Reporter().summary(RunDocument.from_json(doc), tmp_path / "out")
    warned = [line for line in capsys.readouterr().out.splitlines() if line.startswith("warning: ")]
    assert warned and "speed changed while it was measured" in warned[0]  # in the answer, in a line


def test_pairs_alternate_their_order_and_name_a_failing_side(tmp_path):
    calls: list[str] = []

    class Runner:
        def __init__(self, fail: str | None = None) -> None:
            self.fail = fail

        def run_script(self, launcher, *, steps, workdir, timeout_s):
            calls.append(launcher.name)
            if launcher.name == self.fail:
                raise RuntimeError(f"{launcher.name} failed (exit code 1)")
            return ScriptReport(samples_per_s=200.0 if launcher.name == "c" else 100.0)

    b = standalone.Script(Path("b"), TrialConfig(batch_size=32), 100.0)
    c = standalone.Script(Path("c"), TrialConfig(batch_size=32), 200.0)
    pairs = standalone.alternate(Runner(), baseline=b, candidate=c, pairs=4, seconds=1.0,
                                 workdir=tmp_path, timeout_s=10)
    assert calls == ["b", "c", "c", "b", "b", "c", "c", "b"]
    assert pairs.ratios == [2.0] * 4
    assert b.steps(1.0) == 3 + 10 and c.steps(2.0) == 3 + 12
    with pytest.raises(standalone.ScriptFailed) as err:
        standalone.alternate(Runner(fail="c"), baseline=b, candidate=c, pairs=2, seconds=1.0,
                             workdir=tmp_path, timeout_s=10)
    assert err.value.role == "candidate"


def test_a_baseline_script_that_fails_alone_ends_the_run_with_a_message(task, tmp_path):
    class BaselineScriptFails(StandInRunner):
        def run_script(self, launcher, **kw):
            if Path(launcher).parent.name == "baseline":
                raise RuntimeError("launch.sh failed (exit code 1):\nImportError: no module x")
            return super().run_script(launcher, **kw)

    with pytest.raises(NotVerified, match="baseline's script .* failed when run alone") as err:
        tune_stand_in(task, tmp_path, BaselineScriptFails(recorded_machine("avx2_epyc")))
    assert "no module x" in str(err.value)


def test_autotune_verify_says_when_today_lands_outside_the_printed_interval(
        task, tmp_path, monkeypatch, capsys):
    doc = tune_stand_in(task, tmp_path, StandInRunner(recorded_machine("avx2_epyc")))
    assert doc["verified"]

    class SlowerNow(StandInRunner):
        """The same machine, later: the emitted configuration runs at 80% of its speed."""

        def throughput(self, cfg):
            slow = 0.8 if cfg == TrialConfig.from_dict(doc["config"]) else 1.0
            return super().throughput(cfg) * slow

    result = reverify(tmp_path / "out", options=pipeline.RunOptions(rounds=4, pairs=4, pair_seconds=1.0),
                      reporter=Reporter(), machine=recorded_machine("avx2_epyc"),
                      runner=SlowerNow(recorded_machine("avx2_epyc")))
    assert result.outside_printed_interval is not None
    assert "is below the interval printed when this configuration was tuned" in result.outside_printed_interval
    written = json.loads((tmp_path / "out" / "reverify.json").read_text())
    assert written == result.to_json()
    assert result.speedup is not None
    assert result.speedup.interval.ratio == pytest.approx(0.8 * doc["speedup"]["median"])
    assert written["speedup"]["median"] == result.speedup.interval.ratio
    assert written["outside_printed_interval"]


def test_autotune_verify_runs_a_copied_folder_and_trains_the_model_file_it_is_given(
        task, tmp_path, monkeypatch):
    import shutil

    doc = tune_stand_in(task, tmp_path, StandInRunner(recorded_machine("avx2_epyc")))
    assert doc["verified"]
    copy = tmp_path / "elsewhere" / "copied"
    shutil.copytree(tmp_path / "out", copy)
    shutil.rmtree(tmp_path / "out")  # nothing left where it was tuned
    other_model = tmp_path / "mine.py"
    shutil.copy(task.path, other_model)
    monkeypatch.setenv("MODEL_FILE", "the user's own")
    seen = {}

    class Watching(StandInRunner):
        def run_script(self, launcher, **kw):
            seen.setdefault("launchers", []).append(Path(launcher))
            seen.setdefault("model_file", os.environ.get("MODEL_FILE"))
            return super().run_script(launcher, **kw)

    result = reverify(copy, options=pipeline.RunOptions(rounds=4, pairs=4, pair_seconds=1.0),
                      reporter=Reporter(), machine=recorded_machine("avx2_epyc"),
                      runner=Watching(recorded_machine("avx2_epyc")), model_file=other_model)
    assert result.verified
    assert copy / "launch.sh" in seen["launchers"]  # the copy's own launch.sh
    assert seen["model_file"] == str(other_model)  # what both scripts train
    assert os.environ["MODEL_FILE"] == "the user's own"  # restored afterwards
    assert (copy / "reverify.json").is_file()


def test_autotune_verify_fresh_trials_measures_each_configuration_in_a_fresh_process(task, tmp_path, monkeypatch):
    """`autotune verify --fresh-trials` builds the trial runner a run with that flag would."""
    from autotune import reverify as again

    tune_stand_in(task, tmp_path, StandInRunner(recorded_machine("avx2_epyc")))
    built = []

    def watched(*args, **kwargs):
        built.append(again.make_runner.__wrapped__(*args, **kwargs))
        return StandInRunner(recorded_machine("avx2_epyc"))

    watched.__wrapped__ = again.make_runner
    monkeypatch.setattr(again, "make_runner", watched)
    for warm in (False, True):
        again.reverify(tmp_path / "out", options=pipeline.RunOptions(rounds=4, pairs=4, pair_seconds=1.0,
                                                                     warm_trials=warm),
                       reporter=Reporter(), machine=recorded_machine("avx2_epyc"))
    for runner in built:
        runner.shutdown()
    assert [runner.warm for runner in built] == [False, True]


@pytest.mark.slow  # its check is a real one, forked from a warm interpreter
def test_autotune_verify_hands_the_interpreter_its_check_warmed_to_its_trials(task, tmp_path, monkeypatch):
    """As a run does (``harness.make_runner``): the interpreter that `autotune verify`'s check
    of the model file warmed becomes its trial runner's, rather than stay idle beside it, its
    memory held, while the trials import torch again."""
    from autotune import reverify as again
    from autotune.trials import forkserver

    tune_stand_in(task, tmp_path, StandInRunner(recorded_machine("avx2_epyc")))
    built = []

    def watched(*args, **kwargs):
        warmed = forkserver.shared().pids()  # the check's, reverify's load_task just ran it
        built.append((warmed, again.make_runner.__wrapped__(*args, **kwargs), forkserver.shared().pids()))
        return StandInRunner(recorded_machine("avx2_epyc"))

    watched.__wrapped__ = again.make_runner
    monkeypatch.setattr(again, "make_runner", watched)
    again.reverify(tmp_path / "out", options=pipeline.RunOptions(rounds=4, pairs=4, pair_seconds=1.0),
                   reporter=Reporter(), machine=recorded_machine("avx2_epyc"))
    [(warmed, runner, left_idle)] = built
    try:
        assert warmed and runner.forks is not None and runner.forks.pids() == warmed
        assert left_idle == []
    finally:
        runner.shutdown()


def test_a_compiled_runs_limit_grows_with_its_measured_compile():
    from autotune.trials.limits import run_limit_s

    assert run_limit_s(300.0, one_time_s=None, measuring_s=50.0) == 300.0  # nothing measured
    assert run_limit_s(300.0, one_time_s=20.0, measuring_s=30.0) == 300.0  # a short compile
    assert run_limit_s(300.0, one_time_s=240.0, measuring_s=30.0) == 3 * 240.0 + 30.0  # max-autotune
    results = [TrialSummary(one_time_s=1.0, wall_s=20.0), TrialSummary(one_time_s=200.0, wall_s=230.0),
               TrialSummary(one_time_s=None)]
    assert standalone.script_timeout_s(300.0, results, seconds=8.0) == 3 * 200.0 + 30.0 + 8.0
    assert standalone.script_timeout_s(300.0, [TrialSummary(one_time_s=None)], seconds=8.0) == 300.0


class LongCompile(StandInRunner):
    """Compiling pays off here, after 200 s of compiling; records each script's limit."""

    def __init__(self, doc: dict) -> None:
        super().__init__(doc)
        self.script_limits: list[float] = []

    def one_time_s(self, cfg: TrialConfig) -> float:
        return 200.0 if cfg.compile != "off" else 0.0

    def run_script(self, launcher, *, steps, workdir, timeout_s):
        self.script_limits.append(timeout_s)
        return super().run_script(launcher, steps=steps, workdir=workdir, timeout_s=timeout_s)


def test_the_scripts_of_a_model_that_compiles_long_get_the_time_it_took(task, tmp_path):
    """A compiled winner whose trial spent 200 s compiling: its script, run alone, is not
    killed at the scripts' 300 s while it compiles again."""
    runner = LongCompile(recorded_machine("avx2_epyc"))
    doc = tune_stand_in(task, tmp_path, runner, trials=12)
    assert doc["verified"] and doc["config"]["compile"] != "off", doc["config"]
    assert runner.script_limits and min(runner.script_limits) >= 3 * 200.0


class TwoSpeeds:
    """The emitted script ("c") at 80,000 samples/s; the baseline's ("b") lands at 14,500 or
    19,500 samples/s from one process start to the next (a coin toss each start), as a
    small-batch MLP's did; every run within 2%."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def baseline(self) -> float:
        return self.rng.choice((14_500.0, 19_500.0)) * math.exp(self.rng.gauss(0.0, 0.02))

    def candidate(self) -> float:
        return 80_000.0 * math.exp(self.rng.gauss(0.0, 0.02))

    def run_script(self, launcher, *, steps, workdir, timeout_s):
        return ScriptReport(samples_per_s=self.candidate() if launcher.name == "c" else self.baseline())


def alone_check(runner, tmp_path, *, pairs: int = 6):
    """The standalone check of ``runner``'s two scripts, side-by-side figures made up; a
    session of ``pairs`` pairs, run to its end (a clear pass would stop at the fewest)."""
    served = CandidateSpeed(interval=Interval(ratio=5.0, low=4.8, high=5.1, level=0.9, rounds=4),
                            ratios=(4.8, 4.9, 5.0, 5.1), samples_per_s=(), median_samples_per_s=80_000.0)
    b = standalone.Script(Path("b"), TrialConfig(batch_size=16), 17_000.0)
    c = standalone.Script(Path("c"), TrialConfig(batch_size=16), 80_000.0)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sequential, "PAIRS_MARGIN", math.inf)
        return standalone.check(runner, baseline=b, candidate=c, served=served,
                                served_baseline=ReferenceSpeed(samples_per_s=(17_000.0,),
                                                               median_samples_per_s=17_000.0),
                                settings=Settings(pairs=pairs, pair_seconds=1.0),
                                workdir=tmp_path, progress=lambda kind, info: None)


@pytest.mark.parametrize(("seed", "slow", "fast"), [(2, 1, 5), (29, 3, 3)])
def test_a_baseline_that_runs_at_two_speeds_is_named_and_the_interval_covers_a_rerun_at_either(
        tmp_path, seed, slow, fast):
    """Seeded sessions of six pairs: in the first the baseline landed once at the slower
    speed and five times at the faster (a session that saw mostly one speed, as the MLP's
    did), in the second three times at each, interleaved. A re-run of as many pairs lands in
    the printed interval, and above the printed lower bound, at least 90% of the time."""
    runner = TwoSpeeds(seed=seed)
    check = alone_check(runner, tmp_path)
    assert check.passed
    detail = check.detail
    m, reruns = detail["pairs"], 200
    inside = above = 0
    for _ in range(reruns):
        again = statistics.median(runner.candidate() / runner.baseline() for _ in range(m))
        inside += detail["ci_low"] <= again <= detail["ci_high"]
        above += again >= detail.get("lower_bound", detail["ci_low"])
    assert inside / reruns >= 0.9 and above / reruns >= 0.9, (inside, above, detail["ci_low"], detail["ci_high"])
    shift = detail["speed_shift"]
    assert re.search(r"the baseline ran at two speeds, about 14,\d{3} and 19,\d{3} samples/s "
                     rf"\({slow} and {fast} of its runs\), from one run to the next", shift), shift
    assert detail["lower_bound"] < detail["median"]
    # the figures and the sentence come back from the document
    figures = Standalone.from_check(Check.from_json({"passed": True, **detail}))
    assert figures is not None and figures.speedup.speed_shift == shift
    assert figures.speedup.lower_bound == detail["lower_bound"]


def test_a_baseline_that_drifts_over_the_pairs_is_named_and_widens_the_interval(tmp_path):
    """The baseline's speed rises from about 3,250 to 3,820 samples/s across the pairs (the
    README example's did within two minutes); the emitted script's follows half as far."""

    class Drifting:
        def __init__(self) -> None:
            self.runs = {"b": 0, "c": 0}

        def run_script(self, launcher, *, steps, workdir, timeout_s):
            i = self.runs[launcher.name]
            self.runs[launcher.name] += 1
            rise = i / 5
            return ScriptReport(samples_per_s=3_250.0 * 1.175 ** rise if launcher.name == "b"
                                else 6_080.0 * 1.08 ** rise * (1.0 + 0.004 * (-1) ** i))

    drifting = alone_check(Drifting(), tmp_path)
    assert drifting.passed
    assert re.search(r"the baseline's speed drifted from 3,2\d\d to 3,8\d\d samples/s over the pairs",
                     drifting.detail["speed_shift"]), drifting.detail["speed_shift"]
    assert "two speeds" not in drifting.detail["speed_shift"]

    class Steady:
        def run_script(self, launcher, *, steps, workdir, timeout_s):
            return ScriptReport(samples_per_s=3_500.0 if launcher.name == "b" else 6_300.0)

    steady = alone_check(Steady(), tmp_path)
    assert "speed_shift" not in steady.detail
    width = lambda d: math.log(d["ci_high"] / d["ci_low"])  # noqa: E731
    assert width(drifting.detail) > 1.3 * width(steady.detail)


def test_a_noisy_baseline_at_one_speed_is_not_said_to_run_at_two(tmp_path):
    class Noisy:
        def __init__(self) -> None:
            self.rng = random.Random(11)

        def run_script(self, launcher, *, steps, workdir, timeout_s):
            rate = 8_000.0 if launcher.name == "c" else 4_000.0
            return ScriptReport(samples_per_s=rate * math.exp(self.rng.gauss(0.0, 0.05)))

    check = alone_check(Noisy(), tmp_path)
    assert check.passed and "two speeds" not in check.detail.get("speed_shift", "")
