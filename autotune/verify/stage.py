"""The verification stage: the search's best and the configurations beside it
(``verify.candidates``) checked against the baseline (``verify.gates``), the stages fitted
to what --timeout left (``verify.fit``)."""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path

from autotune.config import TrialConfig
from autotune.document.ablation import Ablation
from autotune.document.run import RunDocument
from autotune.document.stages import Stage, StageRecord, VerificationStages
from autotune.search.batch_range import ramp_of
from autotune.search.ledger import measured_trials
from autotune.search.stage import Searched
from autotune.sections import MeasureOptions, VerifyOptions
from autotune.verify import fit, gates, standalone
from autotune.verify.candidates import batch_rival, choose_candidates
from autotune.verify.deadline import Budget, Costs
from autotune.verify.reference import KEPT_REFERENCES, KeptReferences, measured_rates
from autotune.verify.settings import Settings
from autotune.verify.speed import ReferenceSpeed
from autotune.verify.trainings import slowest_rate
from autotune.verify.verdict import Verdict
from autotune.workbench import Workbench


@dataclasses.dataclass(frozen=True)
class Verified:
    """What verification found: the ``winner`` (None: none passed, the baseline stands), every
    candidate's verdict, the baseline's side-by-side speed (else its search value), the
    candidates as fitted, in their order, the stages as they ran, and each configuration's
    launch.sh that verification wrote, in the order written (the scripts that ran alone)."""

    winner: Verdict | None
    verdicts: list[Verdict]
    base_speed: ReferenceSpeed
    candidates: list[TrialConfig]
    stages: VerificationStages | None
    scripts: Mapping[TrialConfig, Path] = dataclasses.field(default_factory=dict)


def run_verification(workbench: Workbench, verify: VerifyOptions, measure: MeasureOptions, *,
                     searched: Searched, emit: Callable[[TrialConfig, Path], Path]) -> Verified:
    """The search's best against the baseline: the candidates chosen from its ranking, the
    stages fitted to what --timeout leaves (where it was given), then checked; ``emit(cfg,
    folder)`` writes a candidate's scripts there and returns its launcher
    (``emit.outputs.candidate_emitter``)."""
    outcome, reporter = searched.outcome, workbench.reporter
    assert outcome.baseline is not None  # the search raises otherwise
    # the user's configuration, or, where it ran out of memory, it holding less (search.memory)
    baseline = outcome.baseline.config
    default_threads = outcome.baseline.result.threads_seen

    def same_as_baseline(cfg: TrialConfig) -> bool:
        # Setting threads to what torch picks by default changes nothing.
        return cfg == baseline or (cfg.replace(threads=None) == baseline
                                   and cfg.threads in (None, default_threads))

    others = [c for c in outcome.ranked if not same_as_baseline(c.config)]
    ranked = [c.config for c in others]
    fits = outcome.fits(searched.limit)
    candidates = choose_candidates(ranked, top=verify.top, space=searched.space, machine=workbench.machine, fits=fits,
                                   rival=batch_rival(others))
    # the prices of verification's stages, from what the search measured: what --timeout is
    # fitted to, and what the live panel counts down
    costs = Costs.of_search(outcome, window_s=measure.window_s, evaluate_s=workbench.task.evaluate_s,
                            fresh_start=ramp.fresh_start if (ramp := ramp_of(searched.place.study)) else None)
    budget = None
    if searched.ends_at is not None and verify.timeout_s is not None:
        budget = Budget(timeout_s=verify.timeout_s, ends_at=searched.ends_at, costs=costs)
    asked = Settings.asked(verify).lengthened(
        workbench.task, searched.pricing.plan if searched.pricing is not None else None, measured_rates(outcome))
    settings = dataclasses.replace(
        asked.on(workbench.machine, [(c, r.cuda_peak_mb) for c, r in outcome.results()]),
        pricing=searched.pricing, budget=budget, fits=fits,
        # a script that compiles as its trial did may need longer than the scripts' least
        script_timeout_s=standalone.script_timeout_s(asked.script_timeout_s, [c.result for c in outcome.ranked],
                                                     seconds=asked.pair_seconds))
    fitted = None
    if budget is not None and candidates:
        fitted = fit.fit(settings, candidates, baseline=baseline, budget=budget,
                         has_evaluate=workbench.task.has_evaluate, shortest_run_s=measure.shortest_run_s,
                         ranked=[c for c in ranked if fits(c)])
        settings = dataclasses.replace(fitted.settings, after_gates_s=fitted.after_gates_s)
        candidates = fitted.candidates
        for line in [*(f"{stage.named}: {why}" for stage, why in fitted.shortened.items()), fitted.over]:
            if line:
                reporter.info(f"verify: {line}")
    records: list[StageRecord] = []
    scripts: dict[TrialConfig, Path] = {}

    def emit_candidate(cfg: TrialConfig, folder: Path) -> Path:
        # a candidate faster by its pairs' median but not verified is named by its scripts
        # (document.kept), which stay where they were written
        scripts[cfg] = emit(cfg, folder)
        return scripts[cfg]

    if candidates:
        reporter.stage("verify", estimate_s={stage.value: seconds for stage, seconds in fit.estimate(
            settings, candidates, baseline=baseline, costs=costs, has_evaluate=workbench.task.has_evaluate).items()})
        reporter.info(f"verifying {len(candidates)} candidates against the baseline ...")
        winner, verdicts, base_speed = gates.verify_candidates(
            workbench.runner, baseline=baseline, candidates=candidates, reserve=ranked,
            settings=settings, has_evaluate=workbench.task.has_evaluate,
            emit_candidate=emit_candidate, workdir=workbench.out / "verify", progress=reporter.verify, stages=records,
            slowest=slowest_rate(measured_trials(searched.place.study)), kept=kept_references(workbench),
            evaluate_s=workbench.task.evaluate_s, measured=measured_rates(outcome), scorer=workbench.task.scored_by,
            greater_is_better=workbench.task.greater_is_better, ranks_reorder=workbench.task.ranks_reorder)
    else:
        winner, verdicts, base_speed = None, [], None
    if winner is not None and fitted is not None and Stage.ABLATION in fitted.shortened:
        winner.ablation = Ablation(skipped=fitted.shortened[Stage.ABLATION])
    if base_speed is None:  # nothing was measured side by side: the search's value stands
        base_speed = ReferenceSpeed(samples_per_s=(outcome.baseline.value,),
                                    median_samples_per_s=outcome.baseline.value)
    return Verified(winner=winner, verdicts=verdicts, base_speed=base_speed, candidates=candidates,
                    stages=fit.stages(fitted, records, budget), scripts=scripts)


def recheck(workbench: Workbench, verify: VerifyOptions, *, doc: RunDocument, launcher: Callable[[], Path],
            emit_baseline: Callable[[TrialConfig, Path], Path],
            config: TrialConfig | None = None) -> tuple[Verdict | None, list[Verdict], ReferenceSpeed | None]:
    """The configuration ``doc`` emitted (or ``config``, the one it kept) against its
    baseline, here and now: the same checks as a run's, on the script as it is
    (``launcher()``: its launch.sh) against the baseline's written afresh (``emit_baseline``), without the
    ablation (the configuration as written)."""
    cfg = config if config is not None else doc.config
    peaks = [(cfg, doc.best.cuda_peak_mb)] if doc.best else []
    settings = dataclasses.replace(Settings.asked(verify).on(workbench.machine, peaks), ablation=False)
    return gates.verify_candidates(
        workbench.runner, baseline=doc.baseline.config, candidates=[cfg], settings=settings,
        has_evaluate=workbench.task.has_evaluate,
        emit_candidate=lambda c, where: launcher() if c == cfg else emit_baseline(c, where),
        workdir=workbench.out / "reverify", progress=workbench.reporter.verify, kept=kept_references(workbench),
        evaluate_s=workbench.task.evaluate_s, scorer=workbench.task.scored_by,
        greater_is_better=workbench.task.greater_is_better, ranks_reorder=workbench.task.ranks_reorder)


def kept_references(workbench: Workbench) -> KeptReferences:
    """The output folder's scored fp32 trainings (``KEPT_REFERENCES``), kept between runs."""
    script = workbench.task.script
    return KeptReferences(workbench.out / KEPT_REFERENCES, model_file=Path(workbench.task.path),
                          runs_with=script.to_json() if script is not None else None)
