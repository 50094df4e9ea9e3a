"""The run's document, assembled once from what the search and verification found: the
baseline and the pick with their rates, the speedup, what was rejected and why, and what
the summary says of precision, the batch, memory, the process layout and the planned run.
Its ``environment`` is the emit stage's to fill: each machine of a shared study writes its
own."""
from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from autotune import __version__
from autotune.config import TrialConfig
from autotune.document.kept import Kept
from autotune.document.measures import Baseline, Best, Rejection
from autotune.document.plan import PlanPrediction
from autotune.document.run import Ranked, RunDocument, SearchSummary, SpaceSummary
from autotune.document.utilisation import Utilisation, pick_facts, trial_facts
from autotune.probes import fingerprint, fingerprint_id
from autotune.runtime.json_value import JsonValue
from autotune.search import steering
from autotune.search.batch_range import ramp_of
from autotune.search.ledger import measured_trials
from autotune.search.memory import fit_of
from autotune.search.outcome import Candidate
from autotune.search.stage import Searched
from autotune.search.study import shown_url
from autotune.search.trial_summary import TrialSummary
from autotune.sections import SharingOptions, VerifyOptions
from autotune.verify import batch as verify_batch
from autotune.verify.layout import run_layout_effect
from autotune.verify.precision import precision_note
from autotune.verify.reference import work_key
from autotune.verify.stage import Verified
from autotune.verify.verdict import Verdict, outcomes
from autotune.workbench import Workbench


def build_document(workbench: Workbench, verify: VerifyOptions, sharing: SharingOptions, *, searched: Searched,
                   verified: Verified, options: Mapping[str, JsonValue]) -> RunDocument:
    """The run's document: with a winner, the rates and the speedup are those of its
    standalone pairs (what the user will measure); without one, the baseline's side-by-side
    (or search) rate."""
    outcome, space, machine = searched.outcome, searched.space, workbench.machine
    assert outcome.baseline is not None  # the search raises otherwise
    reference, winner, verdicts = outcome.baseline.config, verified.winner, verified.verdicts
    chosen = winner.config if winner is not None else reference
    claim = winner.standalone if winner is not None else None
    if winner is not None and claim is None:
        raise AssertionError("a winner passed its standalone check, which has figures")
    best = None if claim is None else _best(chosen, claim.median_samples_per_s, outcome.ranked)
    base_speed = verified.base_speed
    baseline = Baseline(
        config=reference,
        samples_per_s=(claim.baseline_median_samples_per_s if claim is not None
                       else base_speed.median_samples_per_s),
        runs=tuple(claim.baseline_samples_per_s if claim is not None else base_speed.samples_per_s))
    pricing, trials = searched.pricing, measured_trials(searched.place.study)
    # ranked before the checks are read: the ranking records its figures in the speed checks
    candidates = tuple(outcomes(verdicts, winner, pricing))
    return RunDocument(
        model_file=str(workbench.task.path), autotune_version=__version__,
        fingerprint={**fingerprint(machine.to_json()), "id": fingerprint_id(machine.to_json())},
        config=chosen, baseline=baseline, best=best,
        speedup=claim.speedup if claim is not None else None,
        verification=dict(winner.checks) if winner is not None else {},
        precision=precision_note(chosen, winner, verdicts, space, exact=verify.exact,
                                 searched={c.config: c.measured.samples_per_s for c in outcome.ranked},
                                 baseline_samples_per_s=outcome.baseline.measured.samples_per_s,
                                 scored_by=workbench.task.scored_by),
        rejected=tuple(Rejection(config=v.config, reason=v.reason, checks=dict(v.checks))
                       for v in verdicts if v is not winner and not v.passed),
        candidates=candidates,
        search=search_summary(searched, sharing),
        space=SpaceSummary(included=space.choices, fixed=space.fixed, excluded=space.excluded),
        layout_effect=run_layout_effect(winner, verdicts, verified.candidates, space, machine),
        environment={}, options=dict(options),
        ablation=winner.ablation if winner is not None else None, stages=verified.stages,
        kept=_kept(verdicts, verified.scripts, out=workbench.out) if winner is None else None,
        memory=fit_of(searched.limit, chosen=chosen, user=space.baseline, reference=reference,
                      user_result=outcome.user_result, measured=outcome.results(), failed=outcome.failed(),
                      alone_peak_mb=claim.peak_mb if claim is not None else None),
        steering=steering.found(searched.place.study),
        batch=verify_batch.describe(
            chosen=chosen, space=space, batch_range=verify.batch_range, pinned=verify.pinned_batch,
            has_evaluate=workbench.task.has_evaluate, unjudged=workbench.task.unjudged,
            ramp=ramp_of(searched.place.study),
            checks=winner.checks if winner is not None else {}, gated=[(v.config, v.checks) for v in verdicts],
            speedup=claim.speedup.interval.ratio if claim is not None else None,
            baseline_samples_per_s=baseline.samples_per_s),
        utilisation=Utilisation.of(
            baseline_facts=trial_facts(outcome.baseline.result.facts), baseline_samples_per_s=baseline.samples_per_s,
            pick_facts=pick_facts(chosen, [*((c, r.facts) for c, r in outcome.results()),
                                           *((c, r.facts) for c, r in trials)], work_key=work_key)
            if best else None,
            pick_samples_per_s=best.samples_per_s if best else None),
        plan=None if pricing is None else PlanPrediction.of(
            pricing, baseline=reference, baseline_samples_per_s=baseline.samples_per_s, chosen=chosen,
            chosen_samples_per_s=best.samples_per_s if best is not None else baseline.samples_per_s))


def _best(chosen: TrialConfig, samples_per_s: float, ranked: Sequence[Candidate]) -> Best:
    """The pick's rate, run alone, and what its trial measured of its memory and one-time
    cost: by what the configuration computes, where ablation dropped a placement knob
    (threads, workers), what was measured of the same work still tells its memory; where it
    dropped another that changed nothing measurable (cuDNN's benchmark, the fused step),
    the measured configuration of its batch and precision nearest it tells it."""
    result = next((c.result for c in ranked if c.config == chosen), None) or next(
        (c.result for c in ranked if work_key(c.config) == work_key(chosen)), None)
    if result is None:
        mine = chosen.to_dict()
        alike = [c for c in ranked if (c.config.batch_size, c.config.precision, c.config.nprocs)
                 == (chosen.batch_size, chosen.precision, chosen.nprocs)]
        nearest = min(alike, default=None,
                      key=lambda c: sum(v != mine.get(k) for k, v in c.config.to_dict().items()))
        result = nearest.result if nearest is not None else TrialSummary()
    return Best(samples_per_s=samples_per_s, peak_mem_mb=result.peak_rss_mb, one_time_s=result.one_time_s,
                cuda_peak_mb=result.cuda_peak_mb, cuda_total_mb=result.cuda_total_mb)


def _kept(verdicts: Sequence[Verdict], scripts: Mapping[TrialConfig, Path], *, out: Path) -> Kept | None:
    """Where nothing was verified, the first candidate, in the order their scripts ran alone,
    whose pairs were faster by their median: its scripts (``scripts``: each configuration's
    launch.sh) are named relative to ``out``, the output folder, so a moved folder finds them."""
    by_config = {v.config: v for v in verdicts}
    for cfg, launcher in scripts.items():
        alone = by_config[cfg].standalone if cfg in by_config else None
        if alone is not None and alone.speedup.interval.ratio > 1.0:
            return Kept.of(cfg, launcher=Path(os.path.relpath(launcher, out)).as_posix(), speedup=alone.speedup)
    return None


def search_summary(searched: Searched, sharing: SharingOptions) -> SearchSummary:
    """What the search did: its trials, the ten best, the study it kept them in."""
    outcome, place = searched.outcome, searched.place
    return SearchSummary(
        trials=len(place.study.trials), measured=outcome.measured, failures=tuple(outcome.failures),
        ranking=tuple(Ranked(config=c.config.short(), samples_per_s=c.measured.samples_per_s,
                             planned_s=c.result.planned_s) for c in outcome.ranked[:10]),
        study=place.name, storage=shown_url(sharing.storage) if sharing.storage else None)
