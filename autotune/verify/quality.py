"""The quality gate: where a knob trades quality (pruning, reduced precision) and the model
file has evaluate(), the candidate is judged against its fp32 twin, trained from the same
seed, initial weights and data order at the same batch, seed after seed until the verdict is
known (``autotune.verify.decide``: the test, its margin and its error rates;
``autotune.verify.reference``: where the fp32 trainings run). The first pair is the one the
numerics check read; each training goes as far into the user's own training as
``autotune.verify.length`` says."""
from __future__ import annotations

from autotune.config import TrialConfig
from autotune.document.measures import Check
from autotune.document.quality import QualityVerdict
from autotune.runtime.knobs import Precision
from autotune.trials.runner import TrialResult
from autotune.verify.decide import Allowance, Seed, judge, sequential
from autotune.verify.length import described
from autotune.verify.reference import quality_reference, where_fp32_fits
from autotune.verify.trainings import Trainings, metrics, trained_samples

# What evaluate() may lose to reduced precision when --max-quality-drop is not given and
# fp32's own spread between seeds is smaller: this share of the fp32 reference's metric
# (higher is better).
PRECISION_QUALITY_DROP = 0.02
REDUCED_PRECISIONS = (Precision.BF16, Precision.FP16, Precision.TF32)


def trades_quality(cand: TrialConfig) -> bool:
    """Whether a knob of ``cand`` trades quality: the quality check scores it."""
    return cand.prune_ratio > 0 or cand.precision in REDUCED_PRECISIONS


def reordered(trainings: Trainings, baseline: TrialConfig, cand: TrialConfig) -> bool:
    """Whether ``cand``'s ranks train on another order of the data than its one-process reference
    (a Lightning script's DistributedSampler, ``Task.ranks_reorder``): their losses step by step
    are not the reference's, and the quality check judges them instead of the numerics check."""
    return trainings.ranks_reorder and cand.nprocs != quality_reference(baseline, cand).nprocs


def by_samples(result: TrialResult, batch_size: int) -> dict[int, float]:
    """evaluate()'s scores along a scored training, by the samples trained before each."""
    return {step * batch_size: score for step, score in result.evaluations}


def quality_check(trainings: Trainings, baseline: TrialConfig, cand: TrialConfig, *,
                  max_drop: float | None) -> Check:
    """Pruning is opt-in: it needs evaluate() and --max-quality-drop. Reduced precision
    is checked against evaluate() where the file has one: its drop from its fp32 twin, seed
    by seed, within --max-quality-drop or PRECISION_QUALITY_DROP of fp32's metric, or half
    fp32's own spread between seeds (``autotune.verify.decide``); without evaluate() the
    numerics check is its gate. Ranks that train on another data order than their one-process
    reference (``reordered``) are judged so too, as fp32 against fp32. The first pair is the one the numerics check read
    (``trainings``); the other seeds train here."""
    has_evaluate = trainings.evaluate
    pruned = cand.prune_ratio > 0
    reduced = cand.precision in REDUCED_PRECISIONS
    ranks = reordered(trainings, baseline, cand)
    if not pruned and not reduced and not ranks:
        return Check(None, {"reason": "no knob of this configuration trades quality"})
    if ranks and not has_evaluate:
        return Check(False, {"reason": f"its {cand.nprocs} ranks train on another order of the data than one "
                                       f"process, and nothing scores a training to judge them: give the script "
                                       f"a validation loop"})
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
    first, failed = metrics(fitted.results)
    if failed is not None:
        return Check(False, {"reason": f"a training for the quality check failed: {failed}"})
    reference, ran = fitted.reference, fitted.candidate
    allowed = max_drop if max_drop is not None else PRECISION_QUALITY_DROP * abs(first["reference"])
    allowance = Allowance(allowed, "--max-quality-drop" if max_drop is not None
                          else f"default: {PRECISION_QUALITY_DROP:.0%} of the fp32 metric", noise_passes=not pruned)
    samples = trained_samples(fitted.results["reference"], reference.batch_size,
                              asked=trainings.steps(ran) * ran.batch_size)
    length = described(samples, trainings.own, batch_size=ran.batch_size)

    def pair(seed: int) -> Seed | str:
        runs = fitted.results if seed == 0 else {
            "reference": trainings.of(reference, "reference", scored=True, seed=seed),
            "candidate": trainings.of(ran, "candidate", scored=True, seed=seed)}
        _, failed = metrics(runs)
        if failed is not None:
            return f"seed {seed}: {failed}"
        return by_samples(runs["reference"], reference.batch_size), by_samples(runs["candidate"], ran.batch_size)

    found = sequential(pair, lambda seeds, final, more_s: judge(seeds, allowance=allowance, samples=samples,
                                                                  length=length, final=final, more_s=more_s),
                       most=trainings.seeds, affords=trainings.affords)
    if isinstance(found, str):
        return Check(False, {"reason": f"a training for the quality check failed: {found}"})
    reference_metric = sum(r[-1] for r in found.references) / found.seeds
    candidate_metric = sum(c[-1] for c in found.candidates) / found.seeds
    detail = {"reference_metric": reference_metric, "candidate_metric": candidate_metric,
              "drop": found.mean_drop, "max_drop": found.margin, "training_samples": samples,
              "seeds": found.seeds, "allowance": allowance.words, "judgement": found.to_json(),
              **({"checked_at_batch": ran.batch_size, "notes": fitted.notes} if fitted.notes else {})}
    if found.verdict is QualityVerdict.ACCEPTED:
        return Check(True, detail)
    detail["reason"] = (f"{trainings.scorer} {trainings.shown(candidate_metric):.4g} against fp32's "
                        f"{trainings.shown(reference_metric):.4g} at the end, "
                        f"the means over {found.seeds} seeds; "
                        f"{found.words()}")
    return Check(False, detail)
