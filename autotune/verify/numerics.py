"""The numerics gate: from the same seed, weights and global batches, a candidate's losses
must track its fp32, eager reference's (``autotune.verify.reference``)."""
from __future__ import annotations

import dataclasses
import math

from autotune.config import TrialConfig
from autotune.document.measures import Check
from autotune.runtime.knobs import Precision
from autotune.trials.protocol import Status
from autotune.trials.runner import TrialResult
from autotune.trials.spec import LossGuard
from autotune.verify.quality import reordered, trades_quality
from autotune.verify.reference import numerics_reference, where_fp32_fits
from autotune.verify.trainings import Trainings

# The numerics check's bound on ``loss_divergence(...)["max_of_initial"]``: the worst
# step's loss difference from the fp32 reference, relative to the reference's first
# loss (the task's loss scale). Relative to each step's own loss, healthy bf16 runs
# stray far as the losses fall toward zero, while against the loss scale they stay
# within a few percent (bench/precision_tolerance.py; the figures are in BENCHMARKS.md).
# bf16 and fp16 are allowed about three times the worst healthy run: a run that
# diverges (NaN, a loss that stops falling or grows) leaves it by tens of percent.
# Several fp32 ranks against one process differ only by rounding.
NUMERICS_TOLERANCE: dict[str, float] = {
    Precision.FP32: 0.02, Precision.TF32: 0.05, Precision.BF16: 0.10, Precision.FP16: 0.10}


def loss_divergence(reference: list[float], candidate: list[float], *, window: int = 5) -> dict[str, float]:
    """How far a candidate's losses stray from the reference's, three ways: the worst
    single step relative to that step's loss; the worst running mean over ``window``
    steps relative to the reference's running mean; the worst step relative to the
    reference's first loss (the loss scale of the task)."""
    n = min(len(reference), len(candidate))
    ref, cand = reference[:n], candidate[:n]
    step = max(abs(a - b) / max(abs(a), 1e-3) for a, b in zip(ref, cand))
    k = max(1, min(window, n))
    means = [(sum(ref[i:i + k]) / k, sum(cand[i:i + k]) / k) for i in range(n - k + 1)]
    smoothed = max(abs(a - b) / max(abs(a), 1e-3) for a, b in means)
    scale = max(abs(ref[0]), 1e-3)
    scaled = max(abs(a - b) / scale for a, b in zip(ref, cand))
    return {"steps": n, "max_step": step, "max_running_mean": smoothed, "max_of_initial": scaled}


def compare_losses(reference: list[float], candidate: list[float], *, tolerance: float,
                   max_lag: int = 0) -> Check:
    """The candidate's losses against the reference's. ``max_lag``: steps the candidate
    may trail by (fp16's GradScaler skips the optimizer steps whose gradients overflow at
    its first scales, so the trajectory is shifted, not wrong): the best alignment counts."""
    if not candidate or any(not math.isfinite(v) for v in candidate):
        return Check(False, {"reason": "the loss became NaN or infinite"})
    lag = min(range(min(max_lag, len(candidate) - 1, len(reference) - 1) + 1),
              key=lambda k: loss_divergence(reference[:len(reference) - k] if k else reference,
                                            candidate[k:])["max_of_initial"])
    reference, candidate = (reference[:len(reference) - lag] if lag else reference), candidate[lag:]
    stats = loss_divergence(reference, candidate)
    n, worst = int(stats["steps"]), stats["max_of_initial"]
    detail = {"steps": n, "max_difference": worst, "max_step_relative": stats["max_step"],
              "tolerance": tolerance, "reference_losses": reference[:n],
              "candidate_losses": candidate[:n]}
    if lag:
        detail["lag_steps"] = lag
    if worst > tolerance:
        scale = max(abs(reference[0]), 1e-3)
        diffs = [abs(a - b) / scale for a, b in zip(reference[:n], candidate[:n])]
        step = diffs.index(max(diffs))
        detail["reason"] = (
            f"losses diverge from the fp32 reference: step {step} loss {candidate[step]:.4g} vs "
            f"{reference[step]:.4g} (difference {worst:.1%} of the initial loss > tolerance "
            f"{tolerance:.0%})"
        )
        return Check(False, detail)
    return Check(True, detail)


# Steps an fp16 trajectory may trail the reference by: the skipped steps of GradScaler's
# first scales (2**16 halves per overflow; a few halvings reach most models' range).
FP16_MAX_LAG = 3


def guard(reference: TrialResult | None, cand: TrialConfig, *, steps: int, tolerance: float) -> LossGuard | None:
    """Where the candidate's training ends early: at the first of its ``steps`` first losses
    that strays from the reference's by more than ``compare_losses`` allows, which rejects
    it whatever follows. None for fp16, whose losses may trail the reference's by a few
    steps (its best alignment is found afterwards), or without the reference's losses."""
    if reference is None or not reference.losses or cand.precision == Precision.FP16:
        return None
    losses = reference.losses[:steps]
    return LossGuard(tuple(losses), tolerance * max(abs(losses[0]), 1e-3))


def numerics_check(trainings: Trainings, baseline: TrialConfig, cand: TrialConfig) -> Check:
    """The candidate's first ``trainings.numerics_steps`` losses against its reference's,
    which runs where fp32 fits (``where_fp32_fits``) and first: the candidate's training
    ends at the first of those losses that strays too far (``guard``), so a broken
    precision is rejected within seconds. Where a knob trades quality, or
    evaluate() will judge a batch unlike the user's (``verify.batch``), the trainings are
    scored, and those checks then read them without training again."""
    if reordered(trainings, baseline, cand):
        return Check(None, {"reason": f"its {cand.nprocs} ranks each take a DistributedSampler's share of the "
                                      "data, in another order than one process: the quality check judges them"})
    quality = trades_quality(cand)
    scored = {"reference": quality,
              "candidate": quality or (trainings.evaluate and cand.batch_size != baseline.batch_size)}
    tolerance = NUMERICS_TOLERANCE[cand.precision]
    done: dict[str, TrialResult] = {}

    def run(cfg: TrialConfig, role: str) -> TrialResult:
        near = (guard(done.get("reference"), cand, steps=trainings.numerics_steps, tolerance=tolerance)
                if role == "candidate" else None)
        done[role] = trainings.of(cfg, role, scored=scored[role], guard=near)
        return done[role]

    fitted = where_fp32_fits(run, trainings.reference(numerics_reference(baseline, cand)), cand)
    results, ran, notes = fitted.results, fitted.candidate, fitted.notes
    shrunk = {"checked_at_batch": ran.batch_size, "notes": notes} if notes else {}
    for role, result in results.items():
        if result.status != Status.OK:
            what = "the fp32 reference" if role == "reference" else "the candidate"
            return Check(False, {"reason": f"{what} failed: {result.describe_failure()}", **shrunk})
    steps = trainings.numerics_steps
    check = compare_losses(results["reference"].losses[:steps], results["candidate"].losses[:steps],
                           tolerance=tolerance,
                           max_lag=FP16_MAX_LAG if cand.precision == Precision.FP16 else 0)
    reference = numerics_reference(baseline, ran)
    return dataclasses.replace(check, detail={
        **check.detail, "reference": {"layout": reference.layout, "batch_size": ran.batch_size},
        **shrunk})
