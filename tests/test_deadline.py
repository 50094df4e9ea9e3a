"""--timeout bounds the whole run: the search gets its share, verification the rest, and
verification's stages are fitted to it in a fixed order, the document saying what was
shortened (autotune.verify.deadline, autotune.verify.fit)."""
from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest

import autotune
from autotune import pipeline, schemas
from autotune.config import TrialConfig
from autotune.document.run import RunDocument
from autotune.document.stages import Stage
from autotune.emit.outputs import candidate_emitter
from autotune.options import SEARCH_SHARE
from autotune.probes import as_machine
from autotune.report.console import Reporter
from autotune.search import stage as search_stage
from autotune.trials.protocol import ProgressEvent
from autotune.verify import fit, gates, sequential
from autotune.verify.deadline import Budget, Costs
from autotune.verify.reserve import room_for_another
from autotune.verify.settings import Settings
from autotune.verify.trainings import evaluation_steps, training_steps

from doubles import StandInRunner, recorded_machine, tune_stand_in
from helpers import MODELS, knob_cnn, pinned_allocator, written_document

BASE = TrialConfig(batch_size=16)
COSTS = Costs(start_s=5.0, window_s=1.0, sample_s=0.001)
# the first trades precision; the best exact one is the fallback kept to the end
CANDIDATES = [TrialConfig(nprocs=2, threads=1, batch_size=64, precision="bf16", allocator="tcmalloc"),
              TrialConfig(nprocs=1, threads=2, batch_size=64, precision="bf16"),
              TrialConfig(nprocs=1, threads=2, batch_size=128),
              TrialConfig(nprocs=2, threads=1, batch_size=32, precision="bf16")]


@pytest.fixture(scope="module")
def task():
    return knob_cnn()


def planned(left: float, settings: Settings | None = None) -> fit.FittedStages:
    budget = Budget(timeout_s=600, ends_at=left, costs=COSTS, clock=lambda: 0.0)
    return fit.fit(settings or Settings(), CANDIDATES, baseline=BASE, budget=budget,
                   has_evaluate=True, shortest_run_s=3.0)


def cost(settings: Settings, candidates=CANDIDATES) -> float:
    """What a plan needs left to be made as ``settings`` say: its estimate and the margin."""
    return fit.MARGIN * sum(fit.estimate(settings, candidates, baseline=BASE, costs=COSTS,
                                         has_evaluate=True).values())


def test_a_deadline_shortens_the_stages_in_the_documented_order():
    asked = Settings()
    assert not planned(cost(asked)).shortened, "what fits is not shortened"
    assert planned(cost(asked) / fit.MARGIN).shortened, "the estimate alone leaves no margin"
    # each step of the order is taken only once the ones before it are at their least
    no_ablation = dataclasses.replace(asked, ablation=False)
    plan = planned(cost(asked) - 1)
    assert list(plan.shortened) == [Stage.ABLATION] and plan.settings == no_ablation
    plan = planned(cost(no_ablation) - 1)
    assert list(plan.shortened) == [Stage.ABLATION, Stage.SPEED]
    assert sequential.FEWEST <= plan.settings.rounds < asked.rounds and plan.settings.pairs == asked.pairs
    fewest_rounds = dataclasses.replace(no_ablation, rounds=sequential.FEWEST)
    plan = planned(cost(fewest_rounds) - 1)
    assert plan.settings.rounds == sequential.FEWEST
    assert sequential.PAIRS_FEWEST <= plan.settings.pairs < asked.pairs
    assert plan.candidates == CANDIDATES and "cut from 6 pairs" in plan.shortened[Stage.STANDALONE]
    fewest_pairs = dataclasses.replace(fewest_rounds, pairs=sequential.PAIRS_FEWEST)
    plan = planned(cost(fewest_pairs) - 1)
    assert len(plan.candidates) < len(CANDIDATES) and plan.settings.pair_seconds == asked.pair_seconds
    assert Stage.GATES in plan.shortened
    essential = fit.essential(CANDIDATES)
    assert essential == CANDIDATES[:1] + CANDIDATES[2:3]  # the first, and the best exact one
    plan = planned(cost(fewest_pairs, essential) - 1)
    assert plan.candidates == essential and 3.0 <= plan.settings.pair_seconds < asked.pair_seconds
    assert "runs of" in plan.shortened[Stage.STANDALONE] and plan.over is None
    # nothing fits: everything at its least, verified anyway, and said so
    plan = planned(10.0)
    least = dataclasses.replace(fewest_pairs, pair_seconds=3.0)
    assert plan.settings == least and plan.candidates == essential
    assert "even at its minimum it takes about" in plan.over and "verifying at the minimum" in plan.over
    assert list(plan.shortened) == [Stage.ABLATION, Stage.SPEED, Stage.GATES, Stage.STANDALONE]


def test_where_even_the_least_does_not_fit_a_measured_configuration_that_fits_is_verified_instead():
    """--timeout bounds the whole run: where the candidates' verification at its least does
    not fit what is left, the fastest configuration the search measured whose own does is
    verified alone, and the plan says which and why; where none does, the least, as before."""
    least = dataclasses.replace(Settings(), ablation=False, rounds=sequential.FEWEST,
                                pairs=sequential.PAIRS_FEWEST, pair_seconds=3.0)
    essential = fit.essential(CANDIDATES)
    cheap = TrialConfig(nprocs=1, threads=2, batch_size=16)  # the user's batch in fp32: no batch or quality check
    assert cost(least, [cheap]) < cost(least, essential)
    ranked = [*CANDIDATES, cheap]

    def planned_with(left: float) -> fit.FittedStages:
        budget = Budget(timeout_s=600, ends_at=left, costs=COSTS, clock=lambda: 0.0)
        return fit.fit(Settings(), CANDIDATES, baseline=BASE, budget=budget, has_evaluate=True,
                       shortest_run_s=3.0, ranked=ranked)

    left = (cost(least, [cheap]) + cost(least, essential)) / 2
    plan = planned_with(left)
    assert plan.candidates == [cheap] and plan.over is None
    assert plan.estimate_s * fit.MARGIN <= left
    said = plan.shortened[Stage.GATES]
    assert f"{cheap.short()} verified instead of {CANDIDATES[0].short()}" in said and "to fit --timeout" in said
    plan = planned_with(cost(least, [cheap]) / 2)  # not even that one: the least, said so
    assert plan.candidates == essential and "verifying at the minimum" in (plan.over or "")


def test_a_cap_the_user_set_below_the_fewest_is_kept():
    plan = planned(1.0, Settings(rounds=3, pairs=3))
    assert (plan.settings.rounds, plan.settings.pairs) == (3, 3)


class Timed(StandInRunner):
    """Trials report where their wall time went: 5 s of start-up beside 3 s of windows,
    from which verification's stages are estimated. A second thread is worth a fifth: a
    winner clear enough for a re-run to stay above 1x."""

    def throughput(self, cfg: TrialConfig) -> float:
        return super().throughput(cfg) * (1.2 if (cfg.threads or 1) > 1 else 1.0)

    def result(self, cfg, **kw):
        res = super().result(cfg, **kw)
        res.phases = {"overhead_s": 5.0, "measure_s": 3.0}
        return res


def test_the_document_and_the_summary_say_which_stages_a_deadline_shortened(task, tmp_path, capsys):
    for name in ("roomy", "tight"):
        (tmp_path / name).mkdir()
    doc = tune_stand_in(task, tmp_path / "roomy", Timed(recorded_machine("avx2_epyc")), timeout_s=400)
    stages = doc["verification_stages"]
    assert stages["timeout_s"] == 400 and 0 < stages["left_s"] <= 400
    shortened = {s["stage"]: s["shortened"] for s in stages["stages"] if "shortened" in s}
    assert shortened == {"ablation": "skipped to fit --timeout 400"}
    assert doc["verified"] and doc["ablation"]["skipped"] == "skipped to fit --timeout 400"
    assert schemas.problem(doc, "best_config") is None

    tight = tune_stand_in(task, tmp_path / "tight", Timed(recorded_machine("avx2_epyc")), timeout_s=30)
    assert tight["verified"], "verified at the minimum"
    stages = tight["verification_stages"]
    assert "verifying at the minimum" in stages["over"]
    by_stage = {s["stage"]: s for s in stages["stages"]}
    assert set(by_stage) == {"gates", "speed", "ablation", "standalone"}
    assert by_stage["speed"]["cap"] == sequential.FEWEST and by_stage["standalone"]["cap"] == sequential.PAIRS_FEWEST
    assert "runs of 3 s instead of 8 s" in by_stage["standalone"]["shortened"]
    assert tight["speedup"]["seconds_per_run"] == 3.0
    assert schemas.problem(tight, "best_config") is None
    assert RunDocument.from_json(tight).to_json() == tight

    Reporter().details(RunDocument.from_json(tight), tmp_path / "tight" / "out")
    printed = capsys.readouterr().out
    assert "ablation: skipped to fit --timeout 30" in printed
    assert "cut from 10 rounds to fit --timeout 30" in printed
    assert "even at its minimum" in printed


def test_without_a_timeout_nothing_is_shortened(task, tmp_path):
    doc = tune_stand_in(task, tmp_path, Timed(recorded_machine("avx2_epyc")))
    stages = doc["verification_stages"]
    assert "timeout_s" not in stages and "over" not in stages
    assert not any("shortened" in s for s in stages["stages"])
    assert doc["speedup"]["seconds_per_run"] == pipeline.RunOptions.pair_seconds


def test_the_search_gets_its_share_of_the_timeout(task, tmp_path, monkeypatch):
    seen = {}
    real = search_stage.Tuner

    def tuner(**kw):
        seen.update(kw)
        return real(**kw)

    monkeypatch.setattr(search_stage, "Tuner", tuner)
    tune_stand_in(task, tmp_path, Timed(recorded_machine("avx2_epyc")), timeout_s=200)
    assert seen["course"].budget.timeout_s == pytest.approx(SEARCH_SHARE * 200)


def test_the_search_leaves_verification_at_least_its_least(task, tmp_path, monkeypatch):
    """The trials of the Timed runner take no time, so the search's share never runs out; but
    verification at its least (each process 5 s to start) does not fit in 60 s: the search
    stops once it has a baseline and a candidate, and says why. With time to spare it runs
    its trials."""
    reasons: list[str] = []
    real = search_stage.Tuner

    def tuner(**kw):
        said = kw["progress"]
        kw["progress"] = lambda kind, info: (reasons.append(info.reason) if kind == ProgressEvent.BUDGET
                                             else None, said(kind, info))
        return real(**kw)

    monkeypatch.setattr(search_stage, "Tuner", tuner)
    for name in ("short", "long"):
        (tmp_path / name).mkdir()
    short = tune_stand_in(task, tmp_path / "short", Timed(recorded_machine("avx2_epyc")), timeout_s=60, trials=12)
    assert reasons and "the rest is verification's" in reasons[0] and short["search"]["measured"] < 12
    reasons.clear()
    long = tune_stand_in(task, tmp_path / "long", Timed(recorded_machine("avx2_epyc")), timeout_s=3600, trials=12)
    assert not reasons and long["search"]["measured"] == 12


def test_the_search_keeps_room_for_its_longest_trial_and_a_margin_on_verifications_estimate():
    """Warm trials of 3 s and one fresh of 12 s: with 100 s left and verification's least
    estimated at 85 s, another trial may be a fresh one and the estimate may grow: no room.
    With 120 s left there is."""
    walls = [3.0, 3.0, 3.0, 12.0]
    assert not room_for_another(now=0.0, ends_at=100.0, trial_walls=walls, need_s=85.0)
    assert room_for_another(now=0.0, ends_at=120.0, trial_walls=walls, need_s=85.0)


def test_a_compile_on_a_gpu_is_not_counted_in_the_next_trials_time():
    """After a compiled trial on a GPU (12 s of its 50 s a trial's, 38 s its compile) the
    search keeps room for a trial as long as its longest other than that compile: the compile
    is priced on its own (``late.too_late``), and no later process pays it cold. On a CPU the
    longest trial's whole time is kept, as before."""
    from autotune.search.outcome import Candidate, SearchOutcome
    from autotune.search.trial_summary import TrialSummary
    from autotune.verify.reserve import Reserve

    def outcome(device: str) -> SearchOutcome:
        cfg = TrialConfig(batch_size=64, device=device, backend="nccl" if device == "cuda" else "gloo")
        trials = [(cfg, 12.0, None), (cfg.replace(compile="default"), 50.0, 38.0)]
        ranked = [Candidate(number=i, config=c, value=1.0, result=TrialSummary(wall_s=wall, one_time_s=once))
                  for i, (c, wall, once) in enumerate(trials)]
        return SearchOutcome(study=None, baseline=ranked[0], ranked=ranked, failures=[])  # type: ignore[arg-type]

    ends_at = time.time() + 100.0
    reserve = Reserve(ends_at=ends_at, need=lambda _: 70.0 / fit.MARGIN, timeout_s=300.0)
    assert reserve.enough(outcome("cuda")) is None  # 12 s and 70 s fit in 100
    assert reserve.enough(outcome("cpu")) is not None  # 50 s and 70 s do not
    assert reserve.room_s(outcome("cuda"), 0.0) == pytest.approx(100.0 - 12.0 - 70.0, abs=1.0)


def test_a_second_candidates_script_runs_alone_only_when_its_pairs_fit(task, tmp_path):
    """The first candidate's script is slower alone; each script run takes 10 s of the
    clock: after its pairs, what is left cannot hold the next one's, and it is not run."""
    machine = recorded_machine("avx2_epyc")

    class SlowerAlone(StandInRunner):
        now = 0.0

        def run_script(self, launcher, **kw):
            SlowerAlone.now += 10.0
            report = super().run_script(launcher, **kw)
            if Path(launcher).parent.name != "baseline":
                report.samples_per_s = 0.5 * self.throughput(BASE)
            return report

    runner = SlowerAlone(machine)
    first, second = TrialConfig(nprocs=1, threads=2, batch_size=64), TrialConfig(nprocs=1, threads=2, batch_size=32)
    budget = Budget(timeout_s=150, ends_at=150.0, costs=COSTS, clock=lambda: SlowerAlone.now)
    records: list = []
    winner, verdicts, _ = gates.verify_candidates(
        runner, baseline=BASE, candidates=[first, second], has_evaluate=False,
        settings=Settings(ablation=False, pairs=6, budget=budget),
        emit_candidate=candidate_emitter(task, as_machine(machine)), workdir=tmp_path, stages=records)
    assert winner is None
    alone = [r for r in records if r.stage is Stage.STANDALONE]
    assert alone[0].ran == sequential.FEWEST and "not faster alone" in alone[0].stopped
    assert alone[1].ran is None and alone[1].shortened == "not run alone to fit --timeout 150"
    assert sum("standalone" in v.checks for v in verdicts) == 1


def test_the_gates_estimate_counts_the_batch_checks_trainings_as_they_run():
    """A bf16 candidate at 32 times the user's batch, judged by evaluate(): it and its fp32
    twin train 40 steps of 512 from each of the fewest seeds a verdict takes (two), and the
    user's configuration as many samples from each, once for both candidates (they differ in
    placement alone; the candidate's own trainings serve the batch check too); without
    evaluate(), one training each and no second seed."""
    base = TrialConfig(batch_size=16)
    cands = [base.replace(batch_size=512, threads=1, precision="bf16"),
             base.replace(batch_size=512, threads=2, precision="bf16")]
    costs = Costs(start_s=0.0, window_s=1.0, sample_s=0.001, trial_start_s=0.0)
    settings = Settings()
    judged = fit.gates_cost(settings, cands, baseline=base, costs=costs, has_evaluate=True)
    unjudged = fit.gates_cost(settings, cands, baseline=base, costs=costs, has_evaluate=False)
    # the reference's and the candidate's 40 steps from two seeds, the user's configuration
    # over 40 x 512 from two seeds
    assert judged == pytest.approx(0.001 * 6 * 40 * 512)
    assert unjudged == pytest.approx(0.001 * (40 * 512 + 40 * 512))


def test_the_gates_estimate_counts_each_scored_trainings_evaluations():
    """evaluate() took 2 s in the model file's check (Task.evaluate_s): a scored training calls
    it at step 0, half and three quarters of the way, and at its end. A bf16 candidate scores
    itself and its fp32 twin from two seeds; a candidate at another batch than the user's
    itself, and, from two seeds, the user's configuration over the same samples at its end
    alone, and itself from the second seed at its end alone."""
    base = TrialConfig(batch_size=16)
    bf16, larger = base.replace(threads=2, precision="bf16"), base.replace(batch_size=64, threads=2)
    costs = Costs(start_s=5.0, window_s=1.0, sample_s=0.001, trial_start_s=1.0)
    timed = dataclasses.replace(costs, evaluate_s=2.0)
    settings = Settings()
    per_training = len(evaluation_steps(training_steps(base, evaluate=True, numerics_steps=40,
                                                       quality_samples=settings.quality_samples))) + 1
    assert per_training == 4

    def grows(cands, *, has_evaluate=True) -> tuple[float, float]:
        gates = [fit.gates_cost(settings, cands, baseline=base, costs=c, has_evaluate=has_evaluate)
                 for c in (timed, costs)]
        least = [fit.least(settings, cands, baseline=base, costs=c, has_evaluate=has_evaluate,
                           shortest_run_s=3.0) for c in (timed, costs)]
        return gates[0] - gates[1], least[0] - least[1]

    assert grows([bf16]) == pytest.approx((2.0 * 4 * per_training,) * 2)
    assert grows([larger]) == pytest.approx((2.0 * (per_training + 3),) * 2)
    assert grows([bf16, larger], has_evaluate=False) == (0.0, 0.0)  # nothing scored, nothing evaluated


EVALUATE_TIMEOUT_S = 120.0
EVALUATE_CALL_S = 1.5  # tests/models/slow_evaluate.py's evaluate(), a call
# How far past --timeout the run may end: under the suite the other test worker shares the two
# cores, and its load changes between the trials verification's costs are estimated from and
# verification itself. Verification at its least takes 75-85 s here on the 2-core EPYC (its
# standalone runs' fresh interpreters most of it): under --timeout 90 it could not fit, and
# the run, verifying at its least, ended at 94-105 s; under 120 it ends at about 106 s alone.
# The plan's count of evaluate()'s calls is asserted on its own, below.
EVALUATE_OVERRUN = 1.15


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_slow_evaluate_is_counted_and_the_run_ends_within_its_timeout(tmp_path, monkeypatch):
    """tests/models/slow_evaluate.py: evaluate() takes 1.5 s a call, and with the batch pinned
    at 32 (the file's is 16) it judges every candidate (the batch check): the candidate's scored
    training calls it 4 times, the user's configuration's over the same samples once. A real
    run under --timeout 120 ends within it, and verification's estimate counts those calls at
    what the model file's check timed."""
    monkeypatch.setenv("AUTOTUNE_TEST_EVALUATE_S", str(EVALUATE_CALL_S))
    plans: list[tuple[dict, fit.FittedStages]] = []
    real = fit.fit

    def spy(*args, **kw):
        plans.append((kw, real(*args, **kw)))
        return plans[-1][1]

    monkeypatch.setattr(fit, "fit", spy)
    started = time.monotonic()
    autotune.tune(MODELS / "slow_evaluate.py", trials=3, timeout=EVALUATE_TIMEOUT_S, out=tmp_path / "out",
                  progress=False, window_s=0.2, windows=2, pair_seconds=1.0, profile=False,
                  fix={"nprocs": 1, "compile": "off", "allocator": pinned_allocator(), "affinity": "none",
                       "precision": "fp32", "batch_size": 32})
    took = time.monotonic() - started
    assert took <= EVALUATE_OVERRUN * EVALUATE_TIMEOUT_S, f"the run took {took:.0f} s"
    [(kw, plan)] = plans
    costs = kw["budget"].costs
    assert costs.evaluate_s >= EVALUATE_CALL_S  # the check's call, carried by the Task
    untimed = sum(fit.estimate(plan.settings, plan.candidates, baseline=kw["baseline"],
                               costs=dataclasses.replace(costs, evaluate_s=0.0), has_evaluate=True).values())
    assert plan.estimate_s - untimed >= (4 + 1) * costs.evaluate_s - 1e-6  # as summed in floating point
    doc = written_document(tmp_path / "out")
    assert doc["verification_stages"]["estimate_s"] == round(plan.estimate_s, 1)
    # evaluate() judged the candidates' batch (whether a noisy machine lets the pairs verify one or not)
    assert all("batch" in c["checks"] for c in doc["candidates"]), doc["candidates"]


def test_a_fresh_start_is_not_a_compile_and_is_read_off_the_ramp_where_every_trial_ran_warm():
    """A compiled trial's cold compile (its one-time cost) is no process's start: verification's
    fresh processes are priced at the uncompiled start, and its compile once per process from
    the cache (``recompile_s``). Where every trial ran in a process an earlier one started, a
    fresh start is what the batch ramp's first step paid, not a warm trial's."""
    from autotune.search.trial_summary import TrialSummary
    from autotune.verify.deadline import FROM_CACHE_SHARE, Costs

    def trial(overhead: float, *, warm: bool = False, once: float | None = None) -> TrialSummary:
        return TrialSummary(status="ok", value=100.0, wall_s=overhead + 3.0, one_time_s=once, warm=warm,
                            phases={"overhead_s": overhead, "measure_s": 3.0, "start_import_s": 0.0 if warm else 8.0})

    results = [trial(12.0, once=0.5), trial(60.0, once=48.0)]
    costs = Costs.from_trials(results, window_s=1.0, baseline_rate=100.0, compiled={1})
    assert costs.start_s == pytest.approx(12.0) and costs.recompile_s == pytest.approx(FROM_CACHE_SHARE * 48.0)
    as_before = Costs.from_trials(results, window_s=1.0, baseline_rate=100.0)  # the compile counted as a start
    assert as_before.start_s == pytest.approx(36.0)
    warm = [trial(2.0, warm=True), trial(2.0, warm=True)]
    assert Costs.from_trials(warm, window_s=1.0, baseline_rate=100.0).start_s == pytest.approx(2.0)
    ramped = Costs.from_trials(warm, window_s=1.0, baseline_rate=100.0, fresh_start=(12.0, 10.0))
    assert ramped.start_s == pytest.approx(12.0) and ramped.setup_s == pytest.approx(10.0)
    assert ramped.trial_start_s == pytest.approx(2.0)  # the gates' runs, handed to warm processes alike


def test_a_gate_run_in_a_warm_process_is_priced_at_the_warm_trials_overhead_and_a_fresh_one_at_a_start():
    """Two fresh trials (10 s of start and warm-up each) and a warm one (2 s): a gate's run
    the runner hands to a warm process pays the warm trial's 2 s, not the median of all
    three (10 s: on the simulated H100 that priced the gates at 135 s for 87 s taken, and
    the search stopped at a fifth of --timeout 300); where no trial ran warm, the median of
    all; the first gate run, fresh, a start."""
    from autotune.search.trial_summary import TrialSummary
    from autotune.verify.deadline import Costs

    def trial(overhead: float, *, warm: bool) -> TrialSummary:
        return TrialSummary(status="ok", value=100.0, wall_s=overhead + 3.0, warm=warm,
                            phases={"overhead_s": overhead, "measure_s": 3.0, "start_import_s": 0.0 if warm else 8.0})

    costs = Costs.from_trials([trial(10.0, warm=False), trial(10.0, warm=False), trial(2.0, warm=True)],
                              window_s=1.0, baseline_rate=100.0)
    assert costs.start_s == pytest.approx(10.0) and costs.trial_start_s == pytest.approx(2.0)
    assert costs.process(samples=100, fresh=False) == pytest.approx(2.0 + 1.0)
    assert costs.process(samples=100, fresh=True) == pytest.approx(10.0 + 1.0)
    cold = Costs.from_trials([trial(10.0, warm=False), trial(14.0, warm=False)], window_s=1.0, baseline_rate=100.0)
    assert cold.trial_start_s == pytest.approx(12.0)


def test_a_standalone_run_is_priced_with_the_imports_its_fresh_interpreter_pays():
    """The search's processes are forked from a warm interpreter that imported torch once
    (``preimported_s``); a standalone run is a fresh interpreter running the emitted script,
    and pays those imports itself: its pairs are priced with them, the side-by-side processes
    (forked too) without."""
    from autotune.search.trial_summary import TrialSummary

    def trial(preimported: float | None) -> TrialSummary:
        return TrialSummary(status="ok", value=100.0, wall_s=4.0, preimported_s=preimported,
                            phases={"overhead_s": 1.0, "measure_s": 3.0, "start_import_s": 0.1, "setup_s": 0.3})

    forked = Costs.from_trials([trial(5.0), trial(5.5), trial(4.0)], window_s=1.0, baseline_rate=100.0)
    assert forked.imports_s == pytest.approx(5.0)
    assert forked.script_start_s == pytest.approx(6.0) and forked.script_setup_s == pytest.approx(5.4)
    assert forked.pairs(3, 1.0) == pytest.approx(3 * 2 * (6.0 + 1.0))
    assert forked.pairs(3, 1.0, ahead=1) == pytest.approx(5.4 + 3 * 2 * max(0.6 + 1.0, 5.4))
    fresh = Costs.from_trials([trial(None)] * 3, window_s=1.0, baseline_rate=100.0)  # they imported it themselves
    assert fresh.imports_s == 0.0 and fresh.pairs(3, 1.0) == pytest.approx(3 * 2 * (1.0 + 1.0))
    assert forked.side_by_side([TrialConfig(), TrialConfig(threads=2)], 5) == fresh.side_by_side(
        [TrialConfig(), TrialConfig(threads=2)], 5)


def test_a_verdict_trains_another_seed_only_where_the_reserve_holds_it_and_the_stages_after_the_gates():
    plan = planned(cost(Settings()))
    assert 0 < plan.after_gates_s < plan.estimate_s, "the speed check, ablation and pairs, not the gates"
    budget = Budget(timeout_s=600, ends_at=110.0, costs=COSTS, clock=lambda: 0.0)
    settings = Settings(budget=budget, after_gates_s=50.0)
    assert settings.affords(40.0), "110 s left: 100 s less the margin hold 40 s and the 50 s after"
    assert not settings.affords(60.0)
    assert Settings().affords(1e9), "without --timeout the most seeds alone bound a verdict"
