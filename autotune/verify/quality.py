"""The quality gate: where a knob trades quality (pruning, reduced precision) and the model
file has evaluate(), the metric after an identical short training must stay within the
allowed drop of its fp32 reference's (``autotune.verify.reference``)."""
from __future__ import annotations

from autotune.config import TrialConfig
from autotune.document.measures import Check
from autotune.runtime.knobs import Precision
from autotune.verify.reference import quality_reference, where_fp32_fits
from autotune.verify.trainings import Trainings, metrics

# What evaluate() may lose to reduced precision when --max-quality-drop is not given:
# this share of the fp32 reference's metric (higher is better).
PRECISION_QUALITY_DROP = 0.02
REDUCED_PRECISIONS = (Precision.BF16, Precision.FP16, Precision.TF32)


def trades_quality(cand: TrialConfig) -> bool:
    """Whether a knob of ``cand`` trades quality: the quality check scores it."""
    return cand.prune_ratio > 0 or cand.precision in REDUCED_PRECISIONS


def quality_check(trainings: Trainings, baseline: TrialConfig, cand: TrialConfig, *,
                  max_drop: float | None) -> Check:
    """Pruning is opt-in: it needs evaluate() and --max-quality-drop. Reduced precision
    is checked against evaluate() where the file has one, within --max-quality-drop or
    PRECISION_QUALITY_DROP of the reference's metric; without evaluate() the numerics
    check is its gate. The scores are those of the trainings the numerics check read
    (``trainings``: evaluate() runs after them where the model file has it)."""
    has_evaluate = trainings.evaluate
    pruned = cand.prune_ratio > 0
    reduced = cand.precision in REDUCED_PRECISIONS
    if not pruned and not reduced:
        return Check(None, {"reason": "no knob of this configuration trades quality"})
    if pruned and not has_evaluate:
        return Check(False, {"reason": "structured pruning trades quality but the model file has "
                                       "no evaluate(model) to check it with"})
    if pruned and max_drop is None:
        return Check(False, {"reason": "structured pruning trades quality; allow a drop with "
                                       "--max-quality-drop to accept it"})
    if not has_evaluate:
        return Check(None, {"reason": f"{cand.precision}: the model file has no evaluate(); "
                                      "the numerics check is the gate"})
    results, ran, notes = where_fp32_fits(lambda cfg, role: trainings.of(cfg, role, scored=True),
                                           quality_reference(baseline, cand), cand)
    scores, failed = metrics(results)
    if failed is not None:
        return Check(False, {"reason": f"a training for the quality check failed: {failed}"})
    allowed = max_drop if max_drop is not None else PRECISION_QUALITY_DROP * abs(scores["reference"])
    drop = scores["reference"] - scores["candidate"]
    detail = {"reference_metric": scores["reference"], "candidate_metric": scores["candidate"],
              "drop": drop, "max_drop": allowed,
              "training_samples": trainings.steps(ran) * ran.batch_size,
              "allowance": "--max-quality-drop" if max_drop is not None
              else f"default: {PRECISION_QUALITY_DROP:.0%} of the fp32 metric",
              **({"checked_at_batch": ran.batch_size, "notes": notes} if notes else {})}
    if drop > allowed:
        detail["reason"] = (f"quality dropped by {drop:.4g}: evaluate() {scores['candidate']:.4g} "
                            f"against {scores['reference']:.4g} in fp32 (allowed {allowed:.4g})")
        return Check(False, detail)
    return Check(True, detail)
