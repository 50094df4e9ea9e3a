"""Verification stops when it knows: a stage runs rounds (or pairs) until its decision is
settled or its cap, and uses what an earlier stage measured of the same pair."""
from __future__ import annotations

import math
import random
from pathlib import Path

import pytest

from autotune.config import TrialConfig
from autotune.document.interval import Interval
from autotune.trials.runner import Measurement, TrialRunner
from autotune.trials.script_report import ScriptReport
from autotune.verify import ablation, gates, sequential, side_by_side, standalone
from autotune.verify.reference import work_key
from autotune.verify.settings import Settings
from autotune.verify.speed import CandidateSpeed, ReferenceSpeed
from autotune.verify.trainings import Trainings
from autotune.verify.verdict import Verdict, rank_by_rounds

from doubles import NoisyServing, RunnerDouble, ScriptedRunner, StandInRunner, recorded_machine, tune_stand_in
from helpers import MODELS, knob_cnn

BASE = TrialConfig(batch_size=16)


def served_at(speeds: dict[int, float], *, wobbles: frozenset[int] = frozenset(),
              wobble: float = 0.05) -> NoisyServing:
    """Configurations told apart by their batch size, each at its speed, with 2% noise;
    those in ``wobbles`` ``wobble`` faster and slower in turn (a tie with one at the same
    speed straddles 1 round after round)."""
    return NoisyServing(lambda cfg: speeds[cfg.batch_size], noise=0.02,
                        wobble=lambda cfg: wobble if cfg.batch_size in wobbles else 0.0)


def test_fewest_rounds_is_where_the_medians_interval_reaches_its_confidence():
    assert sequential.fewest(0.9) == 5  # 1 - 2 * 0.5**5 = 0.94; at 4 rounds 0.875
    assert sequential.fewest(0.95) == 6


def test_a_clearly_slower_candidate_stops_being_measured_and_its_process_ends():
    # 32 and 64 tie for the lead; 48 is faster than the baseline but clearly slower than them
    runner = served_at({16: 100.0, 32: 200.0, 48: 120.0, 64: 200.0}, wobbles=frozenset({64}))
    cands = [BASE.replace(batch_size=b) for b in (32, 48, 64)]
    speed, checks = side_by_side.speed_check(runner, BASE, cands, rounds=10, rule=sequential.Ranking())
    slow = checks[1].detail
    assert "clearly slower than the leader" in slow["stopped"]
    assert slow["rounds"] == sequential.FEWEST and runner.windows["verify-speed-2"] == sequential.FEWEST
    # ended as soon as it was stopped, while the others went on measuring
    killed = runner.events.index(("kill", "verify-speed-2"))
    assert ("window", "verify-speed-0") in runner.events[killed:]
    assert checks[1].passed, "its verdict against the baseline stands: faster"
    # the tie runs to the cap
    assert speed.rounds == speed.cap == 10 and speed.stopped is None
    assert [c.detail["rounds"] for c in (checks[0], checks[2])] == [10, 10]
    # ranked after the two measured to the end
    verdicts = [Verdict(c, {"speed": ch}, CandidateSpeed.from_check(ch)) for c, ch in zip(cands, checks)]
    assert [v.config.batch_size for v in rank_by_rounds(verdicts)][2] == 48


def test_the_speed_check_ends_once_the_leader_is_clear_and_every_verdict_settled():
    runner = served_at({16: 100.0, 32: 200.0, 48: 90.0})
    speed, checks = side_by_side.speed_check(
        runner, BASE, [BASE.replace(batch_size=32), BASE.replace(batch_size=48)], rounds=10,
        rule=sequential.Ranking())
    assert speed.rounds == sequential.FEWEST
    assert speed.cap == 10 and speed.rounds < speed.cap
    assert speed.stopped is not None and "the leader is clear" in speed.stopped
    assert checks[0].passed and not checks[1].passed
    assert "measured no more" in checks[1].detail["reason"]
    # without a rule the counts are what they were: the cap
    again, _ = side_by_side.speed_check(served_at({16: 100.0, 32: 200.0, 48: 90.0}), BASE,
                                        [BASE.replace(batch_size=32), BASE.replace(batch_size=48)], rounds=10)
    assert again.rounds == 10


def test_a_tie_the_noise_keeps_open_runs_to_the_cap():
    """Windows that straddle each other by more than ALIKE: which is faster stays open."""
    runner = served_at({16: 100.0, 32: 150.0, 64: 150.0}, wobbles=frozenset({64}), wobble=0.1)
    speed, checks = side_by_side.speed_check(
        runner, BASE, [BASE.replace(batch_size=32), BASE.replace(batch_size=64)], rounds=10,
        rule=sequential.Ranking())
    assert speed.rounds == 10 and speed.stopped is None
    assert all(c.passed and "stopped" not in c.detail for c in checks)


def test_held_processes_start_in_overlap_and_no_window_runs_while_one_starts():
    runner = served_at({16: 100.0, 32: 200.0, 48: 150.0, 64: 120.0})
    side_by_side.speed_check(runner, BASE, [BASE.replace(batch_size=b) for b in (32, 48, 64)], rounds=5)
    starting, most, first_window = set(), 0, None
    for i, (kind, name) in enumerate(runner.events):
        if kind == "start":
            starting.add(name)
            most = max(most, len(starting))
        elif kind == "ready":
            starting.discard(name)
        elif kind == "window" and first_window is None:
            first_window = i
    assert most == side_by_side.STARTING_TOGETHER == 2
    assert first_window is not None and all(kind != "start" for kind, _ in runner.events[first_window:])


def test_candidates_alike_end_the_speed_check_before_the_cap():
    """Two candidates as fast as each other, both clearly faster than the baseline: once
    neither can be ALIKE faster than the other, more rounds would only order them within the
    noise."""
    runner = served_at({16: 100.0, 32: 200.0, 64: 200.0})
    speed, checks = side_by_side.speed_check(
        runner, BASE, [BASE.replace(batch_size=32), BASE.replace(batch_size=64)], rounds=10,
        rule=sequential.Ranking())
    assert speed.rounds is not None and speed.cap == 10 and speed.rounds < speed.cap
    assert speed.stopped is not None and "no other candidate" in speed.stopped
    assert all(c.passed and "stopped" not in c.detail for c in checks)


WINNER = TrialConfig(nprocs=1, threads=2, batch_size=64, allocator="tcmalloc")


def test_each_knobs_effect_stops_being_measured_once_settled():
    """The batch pays 2x and the threads 1.3x (settled at the fewest rounds); the allocator
    nothing (its variant's windows straddle the winner's: it runs to the cap). The
    allocator's variant is also the path's step, which the path needs over all the
    session's rounds."""
    def speed(cfg: TrialConfig) -> float:
        return 100.0 * (2.0 if cfg.batch_size == 64 else 1.0) * (1.3 if cfg.threads == 2 else 1.0)

    allocator_variant = WINNER.replace(allocator="default")
    runner = NoisyServing(speed, noise=0.02, wobble=lambda cfg: 0.05 if cfg == allocator_variant else 0.0)
    found = ablation.measure(runner, WINNER, BASE, rounds=10, path=True)
    rounds = {k.knob: k.rounds for k in found.knobs}
    assert rounds == {"layout": sequential.FEWEST, "batch_size": sequential.FEWEST, "allocator": 10}
    assert found.rounds == found.cap == 10 and found.stopped is None
    assert found.path is not None and found.path.rounds == 10
    # the layout's and the batch's variants stopped; the winner, the baseline and the path's
    # two steps (one of them the allocator's variant) went on
    assert sorted(runner.windows.values()) == [sequential.FEWEST] * 2 + [10] * 4

    # every knob settled: the session ends there, and the path still multiplies to the whole
    runner = NoisyServing(lambda cfg: 100.0 * (2.0 if cfg.batch_size == 64 else 1.0)
                          * (1.5 if cfg.allocator == "tcmalloc" else 1.0), noise=0.02)
    found = ablation.measure(runner, WINNER.replace(threads=None), BASE, rounds=10, path=True)
    assert found.rounds == sequential.FEWEST and found.stopped == "every knob's effect settled"
    assert all(k.kept for k in found.knobs)
    assert math.prod(s.effect.ratio for s in found.path.steps) == pytest.approx(found.path.total.ratio)


def test_the_ablation_uses_the_speed_checks_rounds_where_it_measured_the_same_pair():
    rng = random.Random(3)
    rates = lambda level: [level * math.exp(rng.gauss(0, 0.02)) for _ in range(8)]  # noqa: E731
    one_knob = BASE.replace(batch_size=64)
    # the winner differs from the baseline in its batch alone: the speed check measured the
    # whole session (the baseline beside the winner), and nothing is started again
    found = ablation.measure(RunnerDouble(), one_knob, BASE, rounds=10, path=True,
                             measured={BASE: rates(100.0), one_knob: rates(200.0)})
    (knob,) = found.knobs
    assert knob.rounds == 8 and "measured in the speed check's rounds" in knob.note
    assert "speed check" in found.stopped and found.path.total.ratio == pytest.approx(2.0, rel=0.05)

    # two knobs: the batch's variant was a candidate beside the winner, and its effect is
    # settled there; the session holds the rest
    winner = BASE.replace(batch_size=64, allocator="tcmalloc")
    batch_variant = BASE.replace(allocator="tcmalloc")
    runner = NoisyServing(lambda cfg: 200.0 if cfg.batch_size == 64 else 100.0)
    found = ablation.measure(runner, winner, BASE, rounds=6, path=True,
                             measured={winner: rates(200.0), batch_variant: rates(100.0)})
    by_knob = {k.knob: k for k in found.knobs}
    assert "speed check" in by_knob["batch_size"].note and by_knob["batch_size"].rounds == 8
    assert len(runner.windows) == 3, "the winner, the baseline, the allocator's variant (the path's step)"


def test_the_simplified_configuration_is_gated_with_the_runs_already_made(tmp_path):
    """Gates share their runs by what the configuration computes: one that differs only in
    placement (allocator, threads) reuses the trainings both gates read."""
    steps = 40
    runner = ScriptedRunner(losses={"fp32": [2.3 * 0.95 ** i for i in range(steps)],
                                    "bf16": [2.3 * 0.95 ** i for i in range(steps)]},
                            metric={"fp32": 0.9, "bf16": 0.9})
    trainings = Trainings(runner, evaluate=True)
    bf16 = TrialConfig(batch_size=64, precision="bf16", allocator="tcmalloc", threads=2)
    first = gates.gate(trainings, BASE, bf16, settings=Settings())
    ran = len(runner.runs)
    simpler = gates.gate(trainings, BASE, bf16.replace(allocator="default", threads=None),
                         settings=Settings())
    assert first.passed and first.checks["quality"].passed and first.checks["batch"].passed
    # the batch check reads the candidate's scored trainings too, and trains the user's
    # configuration from the same two seeds
    assert ran == 6, ("one training each of the candidate and its reference from each of two seeds serves "
                      "all three gates, with the user's configuration's from both")
    assert simpler.passed and len(runner.runs) == ran


def test_a_run_gates_each_computation_once(tmp_path):
    """Across the whole verification, the simplified configuration included: every
    training the gates ran computes, from its seed, something no other one did."""
    runner = StandInRunner(recorded_machine("avx2_epyc"))
    doc = tune_stand_in(knob_cnn(), tmp_path, runner)
    assert doc["ablation"]["simplified"]
    keys = [(work_key(cfg), seed) for cfg, seed in runner.gated_seeds]
    assert keys and len(keys) == len(set(keys)), keys


class Scripts:
    """Runs the two scripts of a pair: the candidate at ``ratio`` times the baseline's
    speed, each run with log-normal noise ``noise``; ``clock`` advances ``run_s`` a run."""

    def __init__(self, *, ratio: float, noise: float, run_s: float = 0.0, seed: int = 1) -> None:
        self.ratio, self.noise, self.run_s = ratio, noise, run_s
        self.rng, self.now, self.runs = random.Random(seed), 0.0, 0

    def clock(self) -> float:
        return self.now

    def run_script(self, launcher, *, steps, workdir, timeout_s):
        self.now += self.run_s
        self.runs += 1
        rate = 100.0 * (self.ratio if launcher.name == "c" else 1.0)
        return ScriptReport(samples_per_s=rate * math.exp(self.rng.gauss(0.0, self.noise)))


def alone(runner: Scripts, tmp_path: Path, *, pairs: int, budget=None, sbs_noise: float = 0.03):
    """The standalone check of a candidate whose side-by-side rounds spread by ``sbs_noise``."""
    rng = random.Random(5)
    ratios = [runner.ratio * math.exp(rng.gauss(0.0, sbs_noise)) for _ in range(10)]
    served = CandidateSpeed(
        interval=Interval(ratio=runner.ratio, low=min(ratios), high=max(ratios), level=0.9,
                               rounds=len(ratios)),
        ratios=tuple(ratios), samples_per_s=(), median_samples_per_s=100.0 * runner.ratio)
    b = standalone.Script(Path("b"), BASE, 100.0)
    c = standalone.Script(Path("c"), BASE, 100.0 * runner.ratio)
    return standalone.check(runner, baseline=b, candidate=c, served=served,
                            served_baseline=ReferenceSpeed(samples_per_s=(100.0,), median_samples_per_s=100.0),
                            settings=Settings(pairs=pairs, pair_seconds=1.0, budget=budget),
                            workdir=tmp_path, progress=lambda kind, info: None)


def test_pairs_stop_once_the_figure_a_rerun_stays_above_is_settled(tmp_path):
    """From the fewest pairs (3) on, the pairs stop once the printed figure clears 1x with a
    margin; a failure, or a figure that cannot clear 1x, stops them no sooner than the
    side-by-side rules' fewest (5)."""
    steady = alone(Scripts(ratio=3.0, noise=0.005), tmp_path, pairs=8)
    assert steady.passed and steady.detail["pairs"] == sequential.PAIRS_FEWEST
    assert steady.detail["lower_bound"] > sequential.PAIRS_MARGIN and "settled" in steady.detail["stopped"]
    noisy = alone(Scripts(ratio=3.0, noise=0.08), tmp_path, pairs=8)
    assert noisy.passed and noisy.detail["lower_bound"] > 1.0
    # a candidate clearly not faster alone stops as soon as a failure may be called
    slower = alone(Scripts(ratio=0.8, noise=0.02), tmp_path, pairs=8)
    assert not slower.passed and slower.detail["pairs"] == sequential.FEWEST
    assert "not faster alone" in slower.detail["stopped"]
    # 5% faster on a steady machine: the drift between sessions alone keeps a re-run's
    # figure below 1x, and more pairs cannot change that
    level = alone(Scripts(ratio=1.05, noise=0.01), tmp_path, pairs=8)
    assert not level.passed and level.detail["median"] > 1.0 and level.detail["lower_bound"] <= 1.0
    assert level.detail["pairs"] == sequential.FEWEST and "cannot clear 1x" in level.detail["stopped"]
    assert "faster by a median of" in level.detail["reason"] and "may be slower" in level.detail["reason"]


def test_a_figure_still_open_at_the_cap_gets_more_pairs_up_to_the_limit(tmp_path):
    """Noisy pairs whose figure has not cleared 1x at --pairs but could: more pairs, never
    past twice --pairs, and the verdict is the figure's."""
    extended = [alone(Scripts(ratio=1.2, noise=0.1, seed=seed), tmp_path, pairs=6) for seed in range(1, 9)]
    assert any(c.detail["pairs"] > 6 for c in extended), [c.detail["pairs"] for c in extended]
    assert all(c.detail["pairs"] <= 12 for c in extended)
    for c in extended:
        assert c.passed == (c.detail["lower_bound"] > 1.0), c.detail


@pytest.mark.parametrize("ratio", [0.9, 1.0, 1.08, 1.12, 1.2, 1.5, 3.0])
@pytest.mark.parametrize("noise", [0.0, 0.02, 0.1])
def test_a_pass_always_prints_a_figure_above_1x(tmp_path, ratio, noise):
    """"Verified" means the figure printed as "a re-run stays above" is above 1x, whatever
    the speedup and the machine's noise; a candidate below it is never passed."""
    for seed in range(1, 4):
        check = alone(Scripts(ratio=ratio, noise=noise, seed=seed), tmp_path, pairs=6)
        assert check.passed == (check.detail["lower_bound"] > 1.0), check.detail
        assert check.detail["pairs"] >= sequential.PAIRS_FEWEST


def test_under_a_deadline_the_pairs_stop_when_the_next_would_overrun_but_never_below_the_fewest(tmp_path,
                                                                                              monkeypatch):
    from autotune.verify.deadline import Budget, Costs

    monkeypatch.setattr(sequential, "PAIRS_MARGIN", math.inf)  # a pass that would run to the cap
    runner = Scripts(ratio=3.0, noise=0.08, run_s=10.0)
    costs = Costs(start_s=5.0, window_s=1.0, sample_s=0.001)
    roomy = alone(runner, tmp_path, pairs=8, budget=Budget(timeout_s=200, ends_at=140.0, costs=costs,
                                                          clock=runner.clock))
    assert roomy.detail["pairs"] == 7 and "the next pair would overrun" in roomy.detail["stopped"]
    runner = Scripts(ratio=3.0, noise=0.08, run_s=10.0)
    tight = alone(runner, tmp_path, pairs=8, budget=Budget(timeout_s=20, ends_at=15.0, costs=costs,
                                                          clock=runner.clock))
    assert tight.detail["pairs"] == sequential.PAIRS_FEWEST and tight.passed


@pytest.mark.slow
def test_a_stopped_candidates_held_process_ends_while_the_others_are_measured(tmp_path, monkeypatch):
    """Real trials: the candidate made slow (tests/models/verify_slowdown.py) is stopped
    after the fewest rounds, and its process tree is gone before the next round."""
    marker = tmp_path / "slow-now"
    marker.touch()
    monkeypatch.setenv("AUTOTUNE_TEST_SLOW_MARKER", str(marker))
    runner = TrialRunner(model_file=MODELS / "verify_slowdown.py", machine={}, workdir=tmp_path / "trials",
                         measurement=Measurement(warmup_steps=2, window_s=0.2, windows=2))
    started: dict[str, object] = {}
    start = runner.start

    def keep(cfg, *, name, **kw):
        started[name] = start(cfg, name=name, **kw)
        return started[name]

    monkeypatch.setattr(runner, "start", keep)
    seen_after: list[bool] = []

    class NeverEnds(sequential.Ranking):
        """The speed check's rule, without ending the session: it goes on to the cap."""

        def after_round(self, values, active):
            if len(values[0]) > sequential.FEWEST:
                seen_after.append(started["verify-speed-2"].proc.poll() is not None)
            return sequential.Decision(stop=super().after_round(values, active).stop)

    one = TrialConfig(batch_size=16, threads=1)
    _, checks = side_by_side.speed_check(runner, one, [one.replace(batch_size=32), one.replace(batch_size=64)],
                                         rounds=sequential.FEWEST + 1, rule=NeverEnds())
    assert "clearly slower than the leader" in checks[1].detail["stopped"]
    assert seen_after == [True], "the stopped candidate's process had ended before the next round"


class Logged(StandInRunner):
    """Logs what verification does in order: ("serve", cfg), ("train", cfg), ("kill", cfg),
    ("script", None); ``alive`` are the served processes not yet ended."""

    def __init__(self, doc: dict) -> None:
        super().__init__(doc)
        self.log: list[tuple[str, TrialConfig | None]] = []
        self.alive: set[int] = set()

    def run(self, cfg, *, name, **kw):
        if kw.get("trajectory_steps") or kw.get("quality_steps"):
            self.log.append(("train", cfg))
        return super().run(cfg, name=name, **kw)

    def start(self, cfg, *, name, mode=None, **kw):
        served, runner = super().start(cfg, name=name, mode=mode), self
        self.log.append(("serve", cfg))
        self.alive.add(id(served))

        def kill() -> None:
            runner.alive.discard(id(served))
            runner.log.append(("kill", cfg))
        served.kill = kill
        return served

    def run_script(self, launcher, **kw):
        assert not self.alive, "a script ran alone while a served process was alive"
        self.log.append(("script", None))
        return super().run_script(launcher, **kw)


def test_the_speed_checks_processes_start_while_the_gates_train_and_serve_the_ablation(tmp_path):
    runner = Logged(recorded_machine("avx2_epyc"))
    doc = tune_stand_in(knob_cnn(), tmp_path, runner)
    assert doc["verified"] and doc["ablation"]["knobs"]
    kinds = [kind for kind, _ in runner.log]
    # the baseline and the candidates are served before the first gate's training
    first_train = kinds.index("train")
    served_early = [cfg for kind, cfg in runner.log[:first_train] if kind == "serve"]
    baseline = TrialConfig.from_dict(doc["baseline"]["config"])
    assert served_early[0] == baseline and len(served_early) >= 2
    # each configuration is served once: the ablation's winner and baseline are the speed check's
    served = [cfg for kind, cfg in runner.log if kind == "serve"]
    assert served.count(baseline) == 1 and len(served) == len(set(served))
    # and all are ended before the first script runs alone (Logged.run_script checks it)
    assert "script" in kinds
