"""The batch check: a candidate whose global batch is not the user's must train as well.

A larger batch takes fewer optimizer steps over the same samples, and with the user's
learning rate it may learn less from them; the numerics and quality checks compare a
candidate with a reference at its own batch, so they cannot see it. Where the model file
has evaluate(), the candidate and the user's configuration are trained from the same seeds
over the same samples (the quality check's length of the two, the longer: ``Trainings.samples``),
seed after seed, and the candidate passes where its drop from the user's, pair by pair, is
shown within the margin: the allowed drop or half the user's configuration's spread between
seeds, the larger (``autotune.verify.decide``). A drop is a rejection only where it is
shown beyond that margin: a larger batch is not turned away for what a reseed moves.
Without evaluate() nothing can judge a batch the user did not choose: the search keeps to
the range the user allows (``--batch-range``, by default a quarter to eight times the
user's: ``search.batch_range``), and such a batch passes unchecked.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

from autotune.config import TrialConfig
from autotune.document.batch import BatchChoice
from autotune.document.measures import Check
from autotune.document.quality import QualityJudgement, QualityVerdict
from autotune.search.batch_range import Ramp, set_by, unchecked_top
from autotune.space import Space
from autotune.verify.decide import Allowance, Seed, judge, sequential
from autotune.verify.length import described, within
from autotune.verify.trainings import Trainings, metrics, trained_samples

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
    # (never past the user's own training)
    samples = within(max(trainings.samples(baseline), trainings.samples(cand)), trainings.own, batch_size=batch)
    # the user's configuration, on the feeding knobs of the fastest the search measured alike
    user_cfg = trainings.reference(baseline)
    words = ("--max-quality-drop" if max_drop is not None
             else f"default: {BATCH_QUALITY_DROP:.0%} of your configuration's metric")
    trained: list[int] = []  # the samples the first pair's reference trained (a loop's: to its print)

    def pair(seed: int) -> Seed | str:
        runs = {"reference": trainings.for_samples(user_cfg, "batch-reference", samples=samples, seed=seed),
                "candidate": trainings.for_samples(cand, "batch-candidate", samples=samples, seed=seed)}
        scores, failed = metrics(runs)
        if failed is not None:
            return f"seed {seed}: {failed}"
        trained.append(trained_samples(runs["reference"], user_cfg.batch_size, asked=samples))
        return {samples: scores["reference"]}, {samples: scores["candidate"]}

    def decide(seeds: Sequence[Seed], final: bool, more_s: float | None) -> QualityJudgement | None:
        first = seeds[0][0][samples]
        allowed = max_drop if max_drop is not None else BATCH_QUALITY_DROP * abs(first)
        allowance = Allowance(allowed, words, unsettled=QualityVerdict.ACCEPTED)
        return judge(seeds, allowance=allowance, samples=trained[0],
                     length=described(trained[0], trainings.own, batch_size=batch), final=final, more_s=more_s)

    found = sequential(pair, decide, most=trainings.seeds, affords=trainings.affords)
    if isinstance(found, str):
        return Check(False, {"reason": f"a training for the batch check failed: {found}"})
    reference = sum(r[-1] for r in found.references) / found.seeds
    candidate = sum(c[-1] for c in found.candidates) / found.seeds
    detail = {"reference_metric": reference, "candidate_metric": candidate,
              "drop": found.mean_drop, "max_drop": found.margin, "samples": samples, "seeds": found.seeds,
              "reference_batch": user, "candidate_batch": batch,
              "reference_steps": trainings.steps_for(baseline, samples),
              "candidate_steps": trainings.steps_for(cand, samples),
              "lr_factor": cand.lr_factor, "lr_scaling": cand.lr_scaling,
              "allowance": words, "judgement": found.to_json()}
    samples = trained[0]
    what = (f"batch {batch}{_lr(cand)}: {trainings.scorer} {trainings.shown(candidate):.4g} after {samples:,} "
            f"samples against {trainings.shown(reference):.4g} at your batch {user}, "
            f"the means over {found.seeds} seeds")
    if found.verdict is QualityVerdict.ACCEPTED:
        detail["summary"] = f"{what} ({found.words()})"
        return Check(True, detail)
    detail["reason"] = f"{what}: {found.words()}"
    return Check(False, detail)


def describe(*, chosen: TrialConfig, space: Space, batch_range: tuple[int, int] | None, pinned: int | None,
             has_evaluate: bool, unjudged: tuple[str, str] = ("without evaluate(model) in the model file",
                                                              "give the model file an evaluate()"),
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
                     f"measured it); {unjudged[0]} nothing checks that it trains as "
                     f"well as yours. Allow it with --batch-range {min(batches)}-{batch}, or {unjudged[1]}")
    rejected = {str(cfg.batch_size): c["batch"].reason or "failed" for cfg, c in gated
                if "batch" in c and c["batch"].passed is False}
    return BatchChoice(
        chosen=chosen.batch_size, user=user, searched=(min(batches), max(batches)),
        set_by=set_by(space, batch_range=batch_range, pinned=pinned),
        ramp=found.to_json() if found is not None else None, check=said,
        trains_faster=speedup if check is not None and check.passed else None,
        rejected=rejected, unchecked=unchecked)
