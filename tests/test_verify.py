"""Verification: the numbers autotune prints survive re-measurement."""
from __future__ import annotations

import math
import random
import statistics
import subprocess
import sys

import pytest

from autotune.config import TrialConfig
from autotune.document.measures import Check
from autotune.trials.logs import read_event
from autotune.trials.runner import Measurement, TrialResult, TrialRunner
from autotune.verify import device_room, side_by_side, stats
from autotune.verify.device_room import DeviceRoom
from autotune.verify.gates import gate, screen
from autotune.verify.numerics import FP16_MAX_LAG, NUMERICS_TOLERANCE, compare_losses, guard, numerics_check
from autotune.verify.quality import quality_check
from autotune.verify.reference import numerics_reference, smaller_batch
from autotune.verify.settings import Settings
from autotune.verify.speed import CandidateSpeed
from autotune.verify.trainings import Trainings
from autotune.verify.verdict import Verdict, outcomes, rank_by_rounds

from doubles import ScriptedRunner, ServingCounter
from helpers import MODELS

SHORT = Measurement(warmup_steps=2, window_s=0.3, windows=2)


def _verdict(name: str, rates: list[float] | None, *, baseline: list[float]) -> Verdict:
    cfg = TrialConfig(batch_size=len(name) * 16)
    if rates is None:
        return Verdict(cfg, {"speed": Check(False, {"reason": "crashed"})})
    ratios = [r / b for r, b in zip(rates, baseline)]
    speed = CandidateSpeed(interval=stats.ratio_interval(ratios), ratios=tuple(ratios), samples_per_s=tuple(rates),
                           median_samples_per_s=statistics.median(rates))
    return Verdict(cfg, {"speed": Check(True, speed.to_json())}, speed)


def test_candidates_are_ranked_by_windows_of_the_same_round():
    # a ranks first by median ratio to the baseline (2.0 vs 1.9); b is faster than a in
    # 4 of 5 rounds, which is what side-by-side windows are for.
    baseline = [1.0] * 5
    a = _verdict("a", [2.0, 2.0, 2.0, 1.0, 1.0], baseline=baseline)
    b = _verdict("bb", [2.1, 2.1, 1.1, 1.1, 1.9], baseline=baseline)
    failed = _verdict("ccc", None, baseline=baseline)
    assert a.speed is not None and b.speed is not None
    assert a.speed.interval.ratio > b.speed.interval.ratio
    assert rank_by_rounds([a, failed, b]) == [b, a, failed]
    assert b.speed.relative_to_candidates is not None and a.speed.relative_to_candidates is not None
    assert b.speed.relative_to_candidates > 1.0 > a.speed.relative_to_candidates
    # the speed check's figures carry the ranking's
    assert b.checks["speed"].detail["relative_to_candidates"] == b.speed.relative_to_candidates


def test_every_candidate_is_recorded_in_the_order_it_was_tried():
    baseline = [1.0] * 5
    first = _verdict("a", [2.0, 2.1, 2.0, 2.2, 2.0], baseline=baseline)
    emitted = _verdict("bb", [1.8, 1.9, 1.8, 1.9, 1.8], baseline=baseline)
    unchecked = _verdict("ccc", [1.5, 1.4, 1.5, 1.4, 1.5], baseline=baseline)
    crashed = _verdict("dddd", None, baseline=baseline)
    first.checks["numerics"] = Check(False, {"reason": "losses diverge"})
    rows = [r.to_json() for r in outcomes([unchecked, crashed, emitted, first], emitted)]
    assert [r["config_short"] for r in rows] == \
           [v.config.short() for v in (first, emitted, unchecked, crashed)]
    assert [r["outcome"].split(":")[0].split(";")[0] for r in rows] == \
           ["rejected", "emitted", "faster than the baseline", "rejected"]
    assert "losses diverge" in rows[0]["outcome"] and "crashed" in rows[3]["outcome"]
    assert rows[2]["median"] == pytest.approx(1.5) and rows[2]["checks"] == ["speed"]


class _Held:
    def __init__(self, mib: int) -> None:
        self.mib, self.killed = mib, False

    def memory(self) -> int:
        return 0 if self.killed else self.mib * 2**20

    def kill(self) -> None:
        self.killed = True


def test_configurations_held_side_by_side_share_one_memory_budget():
    held = [_Held(300), _Held(500), _Held(400), _Held(200)]  # the baseline first
    live, failures = list(held), [None] * 4
    side_by_side.hold_within_budget(live, failures, 1000 * 2**20)
    # 1,400 MiB held: the largest candidate goes; the 900 MiB left fit
    assert live == [held[0], None, held[2], held[3]] and held[1].killed
    assert "over the budget of 1,000 MiB" in failures[1] and "500 MiB" in failures[1]
    assert failures[2] is None
    # a baseline larger than the rest is never the one stopped
    held = [_Held(900), _Held(300), _Held(200)]
    live, failures = list(held), [None] * 3
    side_by_side.hold_within_budget(live, failures, 1000 * 2**20)
    assert live == [held[0], None, None]


def test_compare_losses_accepts_tracking_and_rejects_divergence_and_nan():
    ref = [2.3, 2.1, 1.9, 1.7]
    assert compare_losses(ref, [2.3, 2.1001, 1.9002, 1.7001], tolerance=0.02).passed
    diverged = compare_losses(ref, [2.3, 2.1, 2.5, 3.0], tolerance=0.02)
    assert not diverged.passed and "diverge" in diverged.detail["reason"]
    nan = compare_losses(ref, [2.3, math.nan, 1.9, 1.7], tolerance=0.02)
    assert not nan.passed and "NaN" in nan.detail["reason"]


@pytest.mark.slow
def test_a_candidate_made_slower_after_the_search_is_caught(tmp_path, monkeypatch):
    marker = tmp_path / "slow-now"
    monkeypatch.setenv("AUTOTUNE_TEST_SLOW_MARKER", str(marker))
    runner = TrialRunner(model_file=MODELS / "verify_slowdown.py", machine={},
                         workdir=tmp_path / "trials", measurement=SHORT)
    baseline = TrialConfig(batch_size=16, threads=1)
    candidate = TrialConfig(batch_size=64, threads=1)
    searched = {c.batch_size: runner.run(c, name=f"search-{c.batch_size}").value
                for c in (baseline, candidate)}
    assert searched[64] > searched[16], "the candidate must look faster in the search"

    marker.touch()  # from now on the candidate sleeps in every step
    _, (check,) = side_by_side.speed_check(runner, baseline, [candidate], rounds=5)
    assert check.passed is False
    assert check.detail["median"] < 1.0
    assert "not faster" in check.detail["reason"]


@pytest.mark.slow
def test_two_ranks_compute_what_one_process_computes(tmp_path):
    """Same seed, weights and global batches: a 2-rank DDP run's averaged losses
    track the 1-process fp32 reference."""
    runner = TrialRunner(model_file=MODELS / "verify_slowdown.py", machine={},
                         workdir=tmp_path, measurement=SHORT)
    baseline = TrialConfig(batch_size=16)
    check = numerics_check(Trainings(runner, evaluate=False, numerics_steps=8), baseline,
                                  TrialConfig(nprocs=2, threads=1, batch_size=32))
    assert check.passed, check.detail
    assert check.detail["max_difference"] < 1e-4
    assert len(check.detail["candidate_losses"]) == 8


@pytest.mark.slow
def test_nan_under_every_config_yields_no_verified_config(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "autotune", "run", str(MODELS / "verify_nan.py"), "--trials", "3",
         "--out", str(out), "--window", "0.2", "--windows", "2", "--fix", "threads=1"],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert "no configuration can be verified" in proc.stderr
    assert "NaN" in proc.stderr
    assert not (out / "best_config.json").exists()


def test_quality_trading_needs_evaluate_and_an_allowed_drop(tmp_path):
    runner = TrialRunner(model_file=MODELS / "knob_cnn.py", machine={}, workdir=tmp_path,
                         measurement=SHORT)
    pruned = TrialConfig(batch_size=16, prune_ratio=0.5)
    no_eval = quality_check(Trainings(runner, evaluate=False), TrialConfig(batch_size=16), pruned,
                                   max_drop=0.1)
    assert no_eval.passed is False and "evaluate" in no_eval.detail["reason"]
    trainings = Trainings(runner, evaluate=True)
    no_drop = quality_check(trainings, TrialConfig(batch_size=16), pruned, max_drop=None)
    assert no_drop.passed is False and "--max-quality-drop" in no_drop.detail["reason"]
    plain = quality_check(trainings, TrialConfig(batch_size=16), TrialConfig(batch_size=32),
                                 max_drop=None)
    assert plain.passed is None  # nothing to check: no knob trades quality
    assert not trainings.runs, "nothing was trained for checks that need no training"


@pytest.mark.slow
def test_quality_check_judges_the_pruned_twin_against_fp32_seed_by_seed(tmp_path):
    runner = TrialRunner(model_file=MODELS / "knob_cnn.py", machine={}, workdir=tmp_path,
                         measurement=SHORT)
    baseline, pruned = TrialConfig(batch_size=16), TrialConfig(batch_size=16, prune_ratio=0.5)
    trainings = Trainings(runner, evaluate=True, numerics_steps=8, quality_samples=640)
    check = quality_check(trainings, baseline, pruned, max_drop=0.05)
    d, j = check.detail, check.detail["judgement"]
    # fp32 and the pruned twin from the same seeds, each scored before its first step and at
    # 20, 30 and 40 steps; seeds added until the interval settles it or the most are spent
    assert j["points"] == [320, 480, 640] and j["untrained"] is not None and d["training_samples"] == 640
    seeds = d["seeds"]
    assert 2 <= seeds <= 6 and len(j["references"]) == len(j["candidates"]) == len(j["drops"]) == seeds
    assert 0.0 <= d["reference_metric"] <= 1.0 and 0.0 <= d["candidate_metric"] <= 1.0
    assert d["reference_metric"] == pytest.approx(sum(r[-1] for r in j["references"]) / seeds)
    for ref, cand, drop in zip(j["references"], j["candidates"], j["drops"]):  # per seed, the median
        assert drop == pytest.approx(statistics.median(r - c for r, c in zip(ref, cand)))
    assert d["drop"] == pytest.approx(statistics.fmean(j["drops"])) == pytest.approx(j["mean_drop"])
    # pruning trades quality by design: the allowance alone is the margin, whatever fp32's noise
    assert j["margin"] == d["max_drop"] == 0.05 and j["noise_widens"] is False
    assert check.passed is (j["verdict"] == "accepted") is (j["high"] <= 0.05)
    assert (j["verdict"] == "rejected") is (j["low"] > 0.05)
    assert j["settled"] or seeds == 6
    if not check.passed:
        assert f"over {seeds} paired seeds" in d["reason"]
    # the first pair serves the numerics check: 40 losses each, nothing trained again
    assert [len(r.losses) for r in trainings.runs.values()] == [40] * 2 * seeds
    assert numerics_check(trainings, baseline, pruned).detail["steps"] == 8
    # an allowance far beyond what pruning costs here accepts it on the first two seeds,
    # trained already
    loose = quality_check(trainings, baseline, pruned, max_drop=0.5)
    assert loose.passed is True and loose.detail["seeds"] == 2 and len(trainings.runs) == 2 * seeds


def test_a_training_guarded_by_its_reference_ends_exactly_where_the_numerics_check_rejects_it():
    rng = random.Random(3)
    ref = [2.3 * 0.95 ** i for i in range(40)]
    reference = TrialResult(status="ok", done=read_event({"e": "done", "losses": ref}))
    near = guard(reference, TrialConfig(batch_size=16, precision="bf16"), steps=40, tolerance=0.1)
    assert near is not None and near.by == pytest.approx(0.23)
    assert guard(reference, TrialConfig(batch_size=16, precision="fp16"), steps=40, tolerance=0.1) is None
    for _ in range(200):
        drift = rng.uniform(0.0, 0.02)
        cand = [v * (1 + drift * i * rng.choice((-1, 1))) for i, v in enumerate(ref)]
        stops = next((i for i, v in enumerate(cand) if near.strays(i, v)), None)
        check = compare_losses(ref, cand, tolerance=0.1)
        assert (stops is None) is bool(check.passed), (drift, stops, check.detail.get("reason"))
        if stops is not None:  # what the training left is rejected as the whole one would be
            assert not compare_losses(ref, cand[:stops + 1], tolerance=0.1).passed


def test_a_healthy_bf16_run_passes_although_late_steps_differ_by_a_lot_relative_to_themselves():
    """cifar_cnn in bf16 (bench/precision_tolerance.py): by step 40 a step's loss may
    differ by 30% of that step's own small loss while staying within 3% of the loss scale."""
    ref = [2.3 * 0.93 ** i for i in range(40)]
    cand = [v + 0.06 * (-1) ** i for i, v in enumerate(ref)]
    check = compare_losses(ref, cand, tolerance=NUMERICS_TOLERANCE["bf16"])
    assert check.passed, check.detail
    assert check.detail["max_step_relative"] > 0.3 and check.detail["max_difference"] < 0.03
    grows = compare_losses(ref, [2.3 * 1.01 ** i for i in range(40)],
                                  tolerance=NUMERICS_TOLERANCE["bf16"])
    assert not grows.passed and "of the initial loss" in grows.detail["reason"]


def test_reduced_precision_needs_no_flag_and_is_held_to_evaluate_when_the_file_has_one():
    base, bf16 = TrialConfig(batch_size=16), TrialConfig(batch_size=64, precision="bf16")
    runner = ScriptedRunner(losses={}, metric={"fp32": 0.90, "bf16": 0.89})
    no_eval = quality_check(Trainings(runner, evaluate=False), base, bf16, max_drop=None)
    assert no_eval.passed is None and not runner.runs, "without evaluate() numerics is the gate"
    ok = quality_check(Trainings(runner, evaluate=True), base, bf16, max_drop=None)
    assert ok.passed and ok.detail["max_drop"] == pytest.approx(0.02 * 0.90)
    # the references are fp32 at the candidate's own batch size, each seed's beside the
    # candidate's from it: only precision differs
    assert [c.batch_size for c in runner.runs] == [64, 64, 64, 64]
    assert [c.exact for c in runner.runs] == [True, False, True, False]
    worse = ScriptedRunner(losses={}, metric={"fp32": 0.90, "bf16": 0.80})
    bad = quality_check(Trainings(worse, evaluate=True), base, bf16, max_drop=None)
    assert bad.passed is False and "0.8" in bad.detail["reason"]
    allowed = quality_check(Trainings(worse, evaluate=True), base, bf16, max_drop=0.2)
    assert allowed.passed


def test_only_what_trades_quality_trains_the_quality_checks_length():
    """With evaluate() in the model file, a configuration that trades no quality trains the
    numerics check's 40 steps alone; a bf16 one and its reference the quality check's
    6,400 samples (400 steps at batch 16), scored, which both gates then read."""
    asked = []

    class Counting(ScriptedRunner):
        def run(self, cfg, *, name, trajectory_steps=None, quality_steps=None, **kw):
            asked.append((cfg.precision, trajectory_steps, quality_steps))
            return super().run(cfg, name=name, trajectory_steps=trajectory_steps, quality_steps=quality_steps)

    healthy = [2.3 * 0.95 ** i for i in range(40)]
    trainings = Trainings(Counting(losses={"fp32": healthy, "bf16": healthy}, metric={"fp32": 0.9, "bf16": 0.9}),
                          evaluate=True)
    base = TrialConfig(batch_size=16)
    assert gate(trainings, base, TrialConfig(batch_size=16, threads=2), settings=Settings()).passed
    assert asked == [("fp32", 40, None)], "the candidate computes what its reference does: one run"
    bf16 = gate(trainings, base, TrialConfig(batch_size=16, precision="bf16"), settings=Settings())
    assert bf16.passed and bf16.checks["quality"].passed
    assert asked[1:] == [("fp32", None, 400), ("bf16", None, 400)] * 2, "the pair again from a second seed"


def test_ranks_that_train_on_another_data_order_are_judged_by_the_quality_check_not_by_their_losses():
    """A Lightning script's ranks each take a DistributedSampler's share of the data: their losses
    step by step are not one process's. The numerics check stands aside and the quality check
    scores them against one process, fp32 against fp32; where nothing scores a training they are
    rejected with the fix. Ranks that see one process's samples (a Trainer's) are compared loss
    by loss, and no quality training runs."""
    asked = []

    class Counting(ScriptedRunner):
        def run(self, cfg, *, name, trajectory_steps=None, quality_steps=None, **kw):
            asked.append((cfg.nprocs, trajectory_steps, quality_steps))
            return super().run(cfg, name=name, trajectory_steps=trajectory_steps, quality_steps=quality_steps)

    runner = Counting(losses={"fp32": [2.3 * 0.95 ** i for i in range(40)]}, metric={"fp32": 0.9})
    base = TrialConfig(batch_size=16)
    two = base.replace(nprocs=2, threads=1)
    judged = gate(Trainings(runner, evaluate=True, ranks_reorder=True), base, two, settings=Settings())
    assert judged.passed and judged.checks["numerics"].passed is None, judged.checks
    assert "the quality check judges them" in judged.checks["numerics"].reason
    assert judged.checks["quality"].passed and judged.checks["quality"].detail["seeds"] >= 1
    assert asked[:2] == [(1, None, 400), (2, None, 400)], "scored: one process, then the two ranks"
    blind = gate(Trainings(runner, evaluate=False, ranks_reorder=True), base, two, settings=Settings())
    assert blind.passed is False and "give the script a validation loop" in blind.reason
    asked.clear()
    same = gate(Trainings(runner, evaluate=True), base, two, settings=Settings())
    assert same.passed and same.checks["numerics"].passed and same.checks["quality"].passed is None
    assert asked == [(1, 40, None), (2, 40, None)]


def test_a_rejected_candidate_is_replaced_by_the_next_of_its_kind_before_any_speed_measurement():
    steps = 40
    healthy = [2.3 * 0.95 ** i for i in range(steps)]
    runner = ScriptedRunner(losses={"fp32": healthy, "bf16": [2.3 * 1.05 ** i for i in range(steps)]},
                            metric={"fp32": 0.9, "bf16": 0.9})
    base = TrialConfig(batch_size=16)
    bf16 = [TrialConfig(batch_size=b, precision="bf16") for b in (64, 128, 32)]
    fp32 = [TrialConfig(batch_size=b, threads=2) for b in (64, 32)]
    settings = Settings(replacements=1)
    passed, verdicts = screen(Trainings(runner, evaluate=False), base, [bf16[0], fp32[0]],
                                     [*bf16, *fp32], settings=settings, progress=lambda kind, info: None)
    assert passed == [fp32[0]]
    assert [v.config for v in verdicts] == [bf16[0], fp32[0], bf16[1]], "one bf16 replacement"
    assert all("diverge" in v.reason for v in verdicts if v.config.precision == "bf16")


def test_a_replacement_is_gated_beside_its_other_layout_as_the_candidate_it_replaces_was():
    """The first candidate goes to verification with its layout contrast (one process against
    ranks): where both are rejected, the replacement comes with its own contrast, so that the
    layout's effect is still measured for what verification goes on with."""
    steps = 40
    healthy = [2.3 * 0.95 ** i for i in range(steps)]
    runner = ScriptedRunner(losses={"fp32": healthy, "bf16": [2.3 * 1.05 ** i for i in range(steps)]},
                            metric={"fp32": 0.9, "bf16": 0.9})
    base = TrialConfig(batch_size=16)
    one, two = (TrialConfig(batch_size=32, precision="bf16", nprocs=1, threads=2),
                TrialConfig(batch_size=32, precision="bf16", nprocs=2, threads=1))
    smaller = one.replace(batch_size=16)
    passed, verdicts = screen(Trainings(runner, evaluate=False), base, [one, two], [one, two, smaller],
                              settings=Settings(replacements=1), progress=lambda kind, info: None)
    assert passed == [] and all("diverge" in v.reason for v in verdicts)
    assert [v.config for v in verdicts] == [one, two, smaller, smaller.replace(nprocs=2, threads=1)]


@pytest.mark.slow
def test_numerics_reject_a_model_that_bf16_breaks_and_pass_one_it_does_not(tmp_path):
    """Real trials (bf16 autocast runs on any CPU, emulated where it is not native: the
    numbers differ in speed, not in value)."""
    base, bf16 = TrialConfig(batch_size=32), TrialConfig(batch_size=32, precision="bf16")
    broken = TrialRunner(model_file=MODELS / "bf16_cancels.py", machine={},
                         workdir=tmp_path / "broken", measurement=SHORT)
    check = numerics_check(Trainings(broken, evaluate=False), base, bf16)
    assert check.passed is False and "diverge" in check.detail["reason"], check.detail
    healthy = TrialRunner(model_file=MODELS / "knob_cnn.py", machine={},
                          workdir=tmp_path / "healthy", measurement=SHORT)
    check = numerics_check(Trainings(healthy, evaluate=False), TrialConfig(batch_size=16),
                                  TrialConfig(batch_size=16, precision="bf16"))
    assert check.passed, check.detail


def test_an_fp16_trajectory_trailing_by_skipped_scaler_steps_is_not_divergence():
    """GradScaler skips the optimizer steps whose gradients overflow at its first scales:
    the fp16 losses trail fp32's by those steps while they fall fastest."""
    reference = [2.3 * 0.9 ** i for i in range(40)]
    trailing = [reference[0]] * 2 + reference[:38]  # two steps skipped
    assert not compare_losses(reference, trailing, tolerance=0.10).passed
    lagged = compare_losses(reference, trailing, tolerance=0.10, max_lag=FP16_MAX_LAG)
    assert lagged.passed and lagged.detail["lag_steps"] == 2
    # a lag does not excuse divergence
    diverging = [2.3 * 1.03 ** i for i in range(40)]
    assert not compare_losses(reference, diverging, tolerance=0.10, max_lag=3).passed


def test_gpu_configurations_unknown_to_fit_together_are_visited_fresh_and_cpu_ones_held():
    runner = ServingCounter()
    base = TrialConfig(device="cuda", backend="nccl", batch_size=16)
    cands = [base.replace(batch_size=32), base.replace(batch_size=64)]
    speed, checks = side_by_side.speed_check(runner, base, cands, rounds=9)  # no room: none held
    assert runner.most == 1  # never two processes on a GPU
    visits = 9 // side_by_side.WINDOWS_PER_VISIT
    assert len(runner.started) == 3 * visits
    # every window is a round, as the sequential rules count them
    assert len(speed.samples_per_s) == visits * side_by_side.WINDOWS_PER_VISIT == speed.rounds
    assert [c.detail["median"] for c in checks] == pytest.approx([2.0, 4.0])
    # the rounds rotate: the baseline is not always measured first
    assert runner.started[:3] == ["verify-speed-0-0", "verify-speed-1-0", "verify-speed-2-0"]
    assert runner.started[3] == "verify-speed-1-1"
    cpu = ServingCounter()
    side_by_side.speed_check(cpu, TrialConfig(batch_size=16), [TrialConfig(batch_size=32)],
                       rounds=3)
    assert cpu.most == 2 and len(cpu.started) == 2  # held side by side


def test_gpu_configurations_that_fit_together_are_held_and_the_rest_visit_beside_them():
    base = TrialConfig(device="cuda", backend="nccl", batch_size=16)
    small, large = base.replace(batch_size=32), base.replace(batch_size=64)
    peaks = {base: 1000.0, small: 2000.0, large: 30000.0}
    roomy = DeviceRoom(capacity_mb=80000.0, peaks_mb=peaks)
    runner = ServingCounter()
    speed, _ = side_by_side.speed_check(runner, base, [small, large], rounds=6, room=roomy)
    assert runner.most == 3 and len(runner.started) == 3  # each started once, held for every round
    assert speed.rounds == 6
    # two large ones fit beside the others one at a time: each starts for each of its visits
    other = base.replace(batch_size=64, precision="bf16")
    peaks[other] = 30000.0
    tight = DeviceRoom(capacity_mb=34000.0 + 3 * device_room.CONTEXT_MB, peaks_mb=peaks)
    assert tight.held_together([base, small, large, other]) == {0, 1}
    runner = ServingCounter()
    speed, checks = side_by_side.speed_check(runner, base, [small, large, other], rounds=6, room=tight)
    assert runner.started.count("verify-speed-0") == runner.started.count("verify-speed-1") == 1
    assert [n for n in runner.started if n.startswith("verify-speed-2-")] == ["verify-speed-2-0", "verify-speed-2-1"]
    assert runner.most == 3 and speed.rounds == 6
    assert [c.detail["median"] for c in checks] == pytest.approx([2.0, 4.0, 4.0])
    # exclusive compute mode, MIG, or nothing measured on the GPUs: all fresh
    assert DeviceRoom(capacity_mb=80000.0, fresh="exclusive", peaks_mb=peaks).held_together([base, small]) == set()
    assert DeviceRoom(capacity_mb=80000.0).held_together([base, small]) == set()
    # a configuration the search did not measure is estimated high: from a larger micro-batch
    # measured, else scaled up from the largest; fp32 from a reduced precision's, twice
    measured = DeviceRoom(capacity_mb=80000.0, peaks_mb={base: 1000.0, small: 2000.0, other: 3000.0})
    assert measured.need_mb(other.replace(num_workers=2)) == 3000.0 + device_room.CONTEXT_MB
    assert measured.need_mb(other.replace(batch_size=128)) == 6000.0 + device_room.CONTEXT_MB
    assert measured.need_mb(other.replace(precision="fp32")) == 6000.0 + device_room.CONTEXT_MB


def test_the_numerics_reference_runs_where_fp32_fits():
    base = TrialConfig(device="cuda", backend="nccl", batch_size=16)
    eight = base.replace(nprocs=8, threads=4, batch_size=1024, precision="bf16")
    ref = numerics_reference(base, eight)
    assert (ref.nprocs, ref.batch_size, ref.precision, ref.compile) == (8, 1024, "fp32", "off")
    cpu = TrialConfig(nprocs=2, threads=1, batch_size=64, precision="bf16")
    assert numerics_reference(TrialConfig(), cpu).nprocs == 1  # on CPU one process
    assert smaller_batch(eight) == 512 and smaller_batch(base.replace(nprocs=8, batch_size=8)) is None
