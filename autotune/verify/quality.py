"""The quality gate: where a knob trades quality (pruning, reduced precision) and the model
file has evaluate(), the candidate's scores along a short training are judged against fp32's
own spread between seeds (``autotune.verify.reference``: where the fp32 trainings run).

One fp32 training against one candidate's says nothing of noise: a short training lands
where its seed takes it, and a loss near 8 moved by more between two fp32 seeds than 2% of
it. So fp32 trains from ``REFERENCE_SEEDS`` seeds, the candidate from the first (its weights
and batches), each scored at the same points past the start-up (``evaluation_steps``), and
the candidate is judged by a non-inferiority test (``judge``)."""
from __future__ import annotations

import statistics
from collections.abc import Sequence

from autotune.config import TrialConfig
from autotune.document.measures import Check
from autotune.document.quality import QualityJudgement, QualityVerdict
from autotune.runtime.knobs import Precision
from autotune.verify.reference import quality_reference, where_fp32_fits
from autotune.verify.trainings import Trainings, metrics

# What evaluate() may lose to reduced precision when --max-quality-drop is not given:
# this share of the fp32 reference's metric (higher is better).
PRECISION_QUALITY_DROP = 0.02
REDUCED_PRECISIONS = (Precision.BF16, Precision.FP16, Precision.TF32)
# fp32 trainings, one per seed (0, 1, ...): the spread of two is the least that says how
# far fp32 moves from itself.
REFERENCE_SEEDS = 2
# A candidate is rejected where it falls below fp32's range by more than this many times
# fp32's spread (or the allowance, if larger). With two references the spread is a range of
# two draws, a rough estimate: a candidate scored like a third fp32 seed falls that far
# below in FALSE_REJECTION of checks at worst (Gaussian scores that move together over the
# three points; 6% where they move half together, 3.5% where independently). The
# candidate shares the first reference's seed, which brings it nearer that reference and
# the rate lower. tests/test_quality_judgement.py draws these again.
SPREAD_FACTOR = 2.0
FALSE_REJECTION = 0.11
# Trainings too short to tell: where fp32's noise, not the allowance, sets the margin and the
# margin is this share or more of what fp32 learned over the training, a precision that
# learned that much less would pass. The verdict is then inconclusive.
TELLING_SHARE = 0.5


def trades_quality(cand: TrialConfig) -> bool:
    """Whether a knob of ``cand`` trades quality: the quality check scores it."""
    return cand.prune_ratio > 0 or cand.precision in REDUCED_PRECISIONS


def judge(references: Sequence[Sequence[tuple[int, float]]], candidate: Sequence[tuple[int, float]], *,
          allowed: float, allowance: str, noise_passes: bool = True) -> QualityJudgement:
    """The non-inferiority test: ``references`` are evaluate()'s (step, score) along each
    fp32 training, ``candidate`` the candidate's; higher scores are better. At each step
    every training was scored at past step 0, fp32's range (its lowest to highest score) and
    how far the candidate fell below its lowest; of each, the median over those steps. Rejected
    where that distance passes the larger of ``allowed`` and ``SPREAD_FACTOR`` times the
    range; inconclusive where the range sets that margin and it is ``TELLING_SHARE`` or more
    of fp32's gain from step 0 to the end; else accepted. ``noise_passes=False`` (a knob
    that trades quality by design, pruning): never accepted on fp32's noise, only within
    ``allowed``; inconclusive where the noise is larger. Trainings scored at no step in
    common are compared at their ends."""
    refs = [dict(r) for r in references]
    cand = dict(candidate)
    common = set(cand)
    for ref in refs:
        common &= set(ref)
    points = tuple(sorted(common - {0}))
    if not points:  # their ends alone, as one point
        last = max(cand)
        refs = [{last: r[max(r)]} for r in refs]
        cand, points = {last: cand[last]}, (last,)
    lows = [min(r[p] for r in refs) for p in points]
    # medians over the points: one evaluation that caught a training mid-swing moves neither
    spread = statistics.median(max(r[p] for r in refs) - low for p, low in zip(points, lows))
    distance = statistics.median(low - cand[p] for p, low in zip(points, lows))
    margin = max(allowed, SPREAD_FACTOR * spread)
    untrained = sum(r[0] for r in refs) / len(refs) if all(0 in r for r in refs) else None
    gain = sum(r[points[-1]] for r in refs) / len(refs) - untrained if untrained is not None else None
    if distance > margin:
        verdict = QualityVerdict.REJECTED
    elif SPREAD_FACTOR * spread > allowed and (not noise_passes or gain is None
                                               or margin >= TELLING_SHARE * gain):
        verdict = QualityVerdict.INCONCLUSIVE
    else:
        verdict = QualityVerdict.ACCEPTED
    return QualityJudgement(points=points, references=tuple(tuple(r[p] for p in points) for r in refs),
                            candidate=tuple(cand[p] for p in points), untrained=untrained, spread=spread,
                            distance=distance, allowed=allowed, allowance=allowance, factor=SPREAD_FACTOR,
                            margin=margin, gain=gain, level=FALSE_REJECTION, verdict=verdict)


def quality_check(trainings: Trainings, baseline: TrialConfig, cand: TrialConfig, *,
                  max_drop: float | None) -> Check:
    """Pruning is opt-in: it needs evaluate() and --max-quality-drop. Reduced precision
    is checked against evaluate() where the file has one, within --max-quality-drop or
    PRECISION_QUALITY_DROP of fp32's metric and fp32's own spread (``judge``); without
    evaluate() the numerics check is its gate. The first fp32 training and the candidate's
    are those the numerics check read (``trainings``); the other seeds train here."""
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
    fitted = where_fp32_fits(lambda cfg, role: trainings.of(cfg, role, scored=True),
                             trainings.reference(quality_reference(baseline, cand)), cand)
    results = dict(fitted.results)
    if "candidate" in results:
        for seed in range(1, REFERENCE_SEEDS):
            results[f"reference (seed {seed})"] = trainings.of(fitted.reference, "reference", scored=True, seed=seed)
    scores, failed = metrics(results)
    if failed is not None:
        return Check(False, {"reason": f"a training for the quality check failed: {failed}"})
    references = [results["reference"].evaluations,
                  *(results[f"reference (seed {seed})"].evaluations for seed in range(1, REFERENCE_SEEDS))]
    allowed = max_drop if max_drop is not None else PRECISION_QUALITY_DROP * abs(scores["reference"])
    judgement = judge(references, results["candidate"].evaluations, allowed=allowed,
                      allowance="--max-quality-drop" if max_drop is not None
                      else f"default: {PRECISION_QUALITY_DROP:.0%} of the fp32 metric", noise_passes=not pruned)
    ran = fitted.candidate
    detail = {"reference_metric": scores["reference"], "candidate_metric": scores["candidate"],
              "drop": scores["reference"] - scores["candidate"], "max_drop": allowed,
              "training_samples": trainings.steps(ran) * ran.batch_size,
              "allowance": judgement.allowance, "judgement": judgement.to_json(),
              **({"checked_at_batch": ran.batch_size, "notes": fitted.notes} if fitted.notes else {})}
    if judgement.verdict is QualityVerdict.ACCEPTED:
        return Check(True, detail)
    if judgement.verdict is QualityVerdict.REJECTED:
        detail["reason"] = f"quality {judgement.words()}"
    else:
        detail["reason"] = (f"quality {judgement.words()}: too noisy for the training to tell; accept it after "
                            f"your own check with --max-quality-drop {SPREAD_FACTOR * judgement.spread:.3g}")
    return Check(False, detail)
