"""The batch check: a candidate whose global batch is not the user's must train as well.

A larger batch takes fewer optimizer steps over the same samples, and with the user's
learning rate it may learn less from them; the numerics and quality checks compare a
candidate with a reference at its own batch, so they cannot see it. Where the model file
has evaluate(), the candidate and the user's configuration are trained from the same seed
over the same samples (the quality check's budget of the two, the longer: ``Trainings.samples``)
and the candidate passes when its metric is within the allowed drop of the user's.
Without evaluate() nothing can judge a batch the user did not choose: the search keeps to
the range the user allows (``--batch-range``, by default a quarter to eight times the
user's: ``search.batch_range``), and such a batch passes unchecked.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

from autotune.config import TrialConfig
from autotune.document.batch import BatchChoice
from autotune.document.measures import Check
from autotune.search.batch_range import Ramp, set_by, unchecked_top
from autotune.space import Space
from autotune.verify.trainings import Trainings, metrics

# What evaluate() may lose to a batch unlike the user's when --max-quality-drop is not
# given: this share of the user's configuration's metric (higher is better), as for
# reduced precision.
BATCH_QUALITY_DROP = 0.02


def _lr(cand: TrialConfig) -> str:
    factor = cand.lr_factor
    return (f" with the learning rate x{factor:.3g} (--scale-lr {cand.lr_scaling})" if factor != 1.0
            else " with your learning rate")


def batch_check(trainings: Trainings, baseline: TrialConfig, cand: TrialConfig, *,
                max_drop: float | None) -> Check:
    """``cand``'s global batch judged against the user's (``baseline``'s) by evaluate()
    after the same samples, where the model file has it."""
    user, batch = baseline.batch_size, cand.batch_size
    if batch == user:
        return Check(None, {"reason": "your batch size"})
    if not trainings.evaluate:
        return Check(None, {"reason": f"batch {batch} is within the range allowed unchecked; the model "
                                      "file has no evaluate() to check that it trains as well"})
    # the longer of the two scored trainings (the numerics check's 40 steps at the larger batch)
    samples = max(trainings.samples(baseline), trainings.samples(cand))
    # the user's configuration, on the feeding knobs of the fastest the search measured alike
    runs = {"reference": trainings.for_samples(trainings.reference(baseline), "batch-reference", samples=samples),
            "candidate": trainings.for_samples(cand, "batch-candidate", samples=samples)}
    scores, failed = metrics(runs)
    if failed is not None:
        return Check(False, {"reason": f"a training for the batch check failed: {failed}"})
    allowed_drop = max_drop if max_drop is not None else BATCH_QUALITY_DROP * abs(scores["reference"])
    drop = scores["reference"] - scores["candidate"]
    detail = {"reference_metric": scores["reference"], "candidate_metric": scores["candidate"],
              "drop": drop, "max_drop": allowed_drop, "samples": samples,
              "reference_batch": user, "candidate_batch": batch,
              "reference_steps": trainings.steps_for(baseline, samples),
              "candidate_steps": trainings.steps_for(cand, samples),
              "lr_factor": cand.lr_factor, "lr_scaling": cand.lr_scaling,
              "allowance": "--max-quality-drop" if max_drop is not None
              else f"default: {BATCH_QUALITY_DROP:.0%} of your configuration's metric"}
    what = (f"batch {batch}{_lr(cand)}: evaluate() {scores['candidate']:.4g} after {samples:,} samples "
            f"against {scores['reference']:.4g} at your batch {user}")
    if drop > allowed_drop:
        detail["reason"] = f"{what}, a drop of {drop:.4g} (allowed {allowed_drop:.4g})"
        return Check(False, detail)
    detail["summary"] = f"{what} (allowed drop {allowed_drop:.4g})"
    return Check(True, detail)


def describe(*, chosen: TrialConfig, space: Space, batch_range: tuple[int, int] | None, pinned: int | None,
             has_evaluate: bool,
             ramp: Ramp | None, checks: Mapping[str, Check],
             gated: Sequence[tuple[TrialConfig, Mapping[str, Check]]], speedup: float | None,
             baseline_samples_per_s: float | None = None) -> BatchChoice:
    """What the summary and best_config.json say about the batch: ``chosen``'s, whose
    ``checks`` these are, the batches ``space`` searched and what set them, ``ramp`` (as the
    study stored it, if it ran), and the ``gated`` candidates the batch check rejected.
    Without evaluate(), a faster batch the ramp saw beyond those allowed is named, as
    against the user's configuration (``baseline_samples_per_s``), with the --batch-range
    that allows it."""
    user = space.baseline.batch_size
    check = checks.get("batch")
    said = None
    if check is not None and check.passed:
        said = check.detail.get("summary")
    elif check is not None and chosen.batch_size != user:
        said = check.reason
    found = ramp
    largest = unchecked_top(user, batch_range)
    unchecked = None
    beyond = found.faster_beyond(largest) if found is not None and not has_evaluate else None
    batches = space.choices.get("batch_size") or [chosen.batch_size]
    if found is not None and beyond is not None:
        batch, rate, within = beyond
        yours = f"{rate / baseline_samples_per_s:.1f}x your speed, " if baseline_samples_per_s else ""
        unchecked = (f"a larger batch was faster but unchecked: batch {batch} ran {yours}{rate:,.1f} samples/s, "
                     f"{rate / within:.2f}x the fastest up to {largest} ({found.config}, as the batch range "
                     "measured it); without evaluate(model) in the model file nothing checks that it trains as "
                     f"well as yours. Allow it with --batch-range {min(batches)}-{batch}, or give the model file "
                     "an evaluate()")
    rejected = {str(cfg.batch_size): c["batch"].reason or "failed" for cfg, c in gated
                if "batch" in c and c["batch"].passed is False}
    return BatchChoice(
        chosen=chosen.batch_size, user=user, searched=(min(batches), max(batches)),
        set_by=set_by(space, batch_range=batch_range, pinned=pinned),
        ramp=found.to_json() if found is not None else None, check=said,
        trains_faster=speedup if check is not None and check.passed else None,
        rejected=rejected, unchecked=unchecked)
