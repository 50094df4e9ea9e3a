"""Verification: the search's winner is a claim; these four checks test it.

1. numerics  from the same seed, weights and global batches, the candidate's losses
             must track an fp32, one-process, eager reference at the same batch size.
2. quality   where a knob trades quality (pruning, reduced precision) and the model
             file has evaluate(), the metric after an identical short training must
             stay within the allowed drop of fp32 at the same batch size.
3. speed     the candidates that passed 1-2 and the baseline, held alive side by side
             and measured in alternating windows, round after round: cheap, it ranks
             them and drops those not faster.
4. standalone  the fastest one's emitted launch.sh against the baseline's script, each
             run alone on the machine, alternating, pair after pair: the speedup
             autotune prints is this one (``autotune.verify.standalone``).

Between 3 and 4 the fastest one's knobs are measured one by one (``autotune.verify.ablation``);
the knobs worth nothing measurable are dropped, and that simpler configuration, gated
again, is run alone first.

1-2 come first so that no speed measurement is spent on a candidate they reject. 3, the
ablation and 4 stop once their decision is settled (``autotune.verify.sequential``), and
under ``--timeout`` they look at the clock (``autotune.verify.fit``).
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from pathlib import Path

from autotune.config import TrialConfig
from autotune.document.ablation import Ablation, Simplified
from autotune.document.measures import Check
from autotune.document.stages import Stage, StageRecord
from autotune.errors import UsageError
from autotune.runtime.knobs import Device
from autotune.trials.progress import Progress, VerifyStep, no_progress
from autotune.trials.protocol import ProgressEvent
from autotune.trials.runner import TrialRunnerLike
from autotune.verify import ablation, sequential, standalone
from autotune.verify.batch import batch_check
from autotune.verify.numerics import numerics_check
from autotune.verify.quality import quality_check
from autotune.verify.reference import KeptReferences, Measured
from autotune.verify.settings import Settings
from autotune.verify.side_by_side import Held, speed_check
from autotune.verify.speed import CandidateSpeed, ReferenceSpeed, plan_check
from autotune.verify.trainings import Trainings
from autotune.verify.verdict import Verdict, rank_by_rounds


def gate(trainings: Trainings, baseline: TrialConfig, cfg: TrialConfig, *, settings: Settings) -> Verdict:
    """The checks that need no speed measurement, numerics then quality, from one short
    training of the candidate and one of its reference (``trainings``), then the batch
    check where its batch is not the user's."""
    verdict = Verdict(cfg, {})
    verdict.checks["numerics"] = numerics_check(trainings, baseline, cfg)
    if verdict.passed:
        verdict.checks["quality"] = quality_check(trainings, baseline, cfg, max_drop=settings.max_quality_drop)
    if verdict.passed:
        verdict.checks["batch"] = batch_check(trainings, baseline, cfg, max_drop=settings.max_quality_drop)
    return verdict


def screen(trainings: Trainings, baseline: TrialConfig, candidates: list[TrialConfig],
           reserve: list[TrialConfig], *, settings: Settings, progress: Progress
           ) -> tuple[list[TrialConfig], list[Verdict]]:
    """Gate every candidate before the speed check measures it, so that no measurement
    goes to a configuration a gate rejects. One that fails is replaced by the next of
    its kind (exact, or reduced precision/pruned) from ``reserve``, best first, up to
    ``settings.replacements`` times per kind; none at a batch no smaller than one the batch
    check rejected (a batch that trains worse, trains no better larger). Returns the
    survivors, in order, and the verdicts of all that were gated. ``trainings``: the
    gates' runs, shared with later gating."""
    tried: set[TrialConfig] = set(candidates)
    too_large: float = math.inf
    spent = {True: 0, False: 0}
    passed: list[TrialConfig] = []
    verdicts: list[Verdict] = []
    queue = list(candidates)
    while queue:
        cfg = queue.pop(0)
        progress(ProgressEvent.STEP, VerifyStep(f"numerics and quality of {cfg.short()}", stage=Stage.GATES.value))
        verdict = gate(trainings, baseline, cfg, settings=settings)
        verdicts.append(verdict)
        if verdict.passed:
            passed.append(cfg)
            continue
        progress(ProgressEvent.STEP, VerifyStep(f"rejected {cfg.short()}: {verdict.reason}"))
        if cfg.batch_size > baseline.batch_size and verdict.checks.get("batch", Check(None)).passed is False:
            too_large = min(too_large, cfg.batch_size)
        if spent[cfg.exact] >= settings.replacements:
            continue
        nxt = next((c for c in reserve if c.exact == cfg.exact and c not in tried
                    and c.batch_size < too_large), None)
        if nxt is not None:
            spent[cfg.exact] += 1
            tried.add(nxt)
            queue.append(nxt)
            # the replacement is measured beside its other process layout, as the one it replaces
            # was (the layout's effect, ``verify.layout``)
            twin = layout_twin(cfg, candidates)
            other = _laid_out(nxt, twin) if twin is not None else None
            if other is not None and other not in tried:
                tried.add(other)
                queue.append(other)
    return passed, verdicts


def _laid_out(cfg: TrialConfig, like: TrialConfig) -> TrialConfig | None:
    """``cfg`` with ``like``'s process layout; None where its batch does not split so."""
    try:
        return cfg.replace(nprocs=like.nprocs, threads=like.threads)
    except UsageError:
        return None


def layout_twin(cfg: TrialConfig, others: Sequence[TrialConfig]) -> TrialConfig | None:
    """The configuration of ``others`` that differs from ``cfg`` in its process layout alone."""
    return next((o for o in others if o.nprocs != cfg.nprocs
                 and o.replace(nprocs=cfg.nprocs, threads=cfg.threads) == cfg), None)


def ablate(runner: TrialRunnerLike, top: Verdict, baseline: TrialConfig, *, settings: Settings,
           speed_windows: int, progress: Progress, measured: dict[TrialConfig, list[float]],
           trainings: Trainings, pool: Held | None = None) -> Verdict | None:
    """Measure each of ``top``'s knobs against the baseline's value (``autotune.verify.ablation``;
    ``measured``: the speed check's rates per round) and record it on ``top``. Returns the
    verdict of the simplified configuration (the knobs worth nothing measurable dropped,
    gated again: ``trainings`` holds the runs it shares) when there is one that
    passes: it is run alone before ``top``."""
    cfg = top.config
    count = len(ablation.session_configs(cfg, baseline, pinned=settings.pinned, path=settings.path))
    rounds = ablation.rounds_for(count, speed_windows=speed_windows)
    top.ablation = ablation.measure(runner, cfg, baseline, rounds=rounds, pinned=settings.pinned,
                                    path=settings.path, measured=measured, progress=progress, pool=pool,
                                    fits=settings.fits, room=settings.room)
    simpler = ablation.simplified(cfg, baseline, top.ablation)
    if simpler in (cfg, baseline):
        return None
    progress(ProgressEvent.STEP, VerifyStep(f"numerics and quality of the simplified {simpler.short()}",
                                            stage=Stage.GATES.value))
    verdict = gate(trainings, baseline, simpler, settings=settings)
    if not verdict.passed:
        top.ablation = dataclasses.replace(
            top.ablation, simplified=Simplified(config=simpler.short(), rejected=verdict.reason))
        return None
    # Its side-by-side speed: the variant's where one knob went, else the winner's (the
    # ablation found the dropped knobs worth nothing measurable).
    dropped = tuple(k.knob for k in top.ablation.knobs if not k.kept)
    verdict.speed = dataclasses.replace(top.speed) if top.speed is not None else None
    verdict.ablation = dataclasses.replace(
        top.ablation, simplified=Simplified(config=simpler.short(), dropped=dropped, from_=cfg.short()))
    return verdict


def verify_candidates(
    runner: TrialRunnerLike, *, baseline: TrialConfig, candidates: list[TrialConfig],
    settings: Settings, has_evaluate: bool,
    emit_candidate: Callable[[TrialConfig, Path], Path], workdir: Path,
    reserve: Sequence[TrialConfig] = (),
    progress: Progress = no_progress,
    stages: list[StageRecord] | None = None, slowest: float | None = None,
    kept: KeptReferences | None = None, evaluate_s: float = 0.0, measured: Measured = (),
    scorer: str = "evaluate()", greater_is_better: bool = True, ranks_reorder: bool = False,
) -> tuple[Verdict | None, list[Verdict], ReferenceSpeed | None]:
    """Gate the candidates (numerics, quality; ``screen``), measure the survivors'
    speed side by side with the baseline, then run the scripts of the fastest first
    alone against the baseline's (at most ``settings.standalone_attempts``); the first
    to pass all four checks wins (the simplified one of ``ablate`` first, when there is
    one). ``emit_candidate(cfg, folder)`` writes a candidate's launch.sh and returns its
    path. Each stage's record (``StageRecord``) is appended to ``stages``. ``slowest``: the
    slowest samples/s the search measured, which sizes the gates' trainings' time limits, with
    ``evaluate_s``, one evaluate() call's seconds (``Task.evaluate_s``); ``kept``: where the
    scored fp32 trainings are kept between runs; ``measured``: the configurations the search
    measured, with their samples/s, whose fastest alike each reference trains on
    (``reference.trained_fast``); ``scorer``: what scores a training, in the verdicts' words
    (``greater_is_better``: its sense, in which its scores are shown); ``ranks_reorder``: its ranks
    see another data order than one process (``Task.ranks_reorder``)."""
    log = stages if stages is not None else []
    trainings = Trainings(runner, evaluate=has_evaluate, numerics_steps=settings.numerics_steps,
                          quality_samples=settings.quality_samples, slowest=slowest, kept=kept,
                          evaluate_s=evaluate_s, measured=measured, own=settings.own, seeds=settings.seeds,
                          affords=settings.affords, scorer=scorer, greater_is_better=greater_is_better,
                          ranks_reorder=ranks_reorder)
    pool = Held(runner)
    try:
        return _verify(runner, baseline=baseline, candidates=candidates, settings=settings,
                       emit_candidate=emit_candidate, workdir=workdir, reserve=reserve, progress=progress,
                       log=log, trainings=trainings, pool=pool)
    finally:
        pool.close()


def _verify(runner: TrialRunnerLike, *, baseline: TrialConfig, candidates: list[TrialConfig],
            settings: Settings, emit_candidate: Callable[[TrialConfig, Path], Path], workdir: Path,
            reserve: Sequence[TrialConfig], progress: Progress, log: list[StageRecord],
            trainings: Trainings, pool: Held) -> tuple[Verdict | None, list[Verdict], ReferenceSpeed | None]:
    if baseline.device != Device.CUDA:
        # started while the gates train (which measures nothing): ready by the speed check.
        # Not on GPUs, where they would take device memory from the gates' trainings.
        pool.start([baseline, *candidates])
    survivors, gated = screen(trainings, baseline, candidates, list(reserve), settings=settings,
                              progress=progress)
    by_cfg = {v.config: v for v in gated}
    pool.close(keeping=[baseline, *survivors])
    base_speed: ReferenceSpeed | None = None
    speed_checks: list[Check] = []
    if survivors:
        base_speed, speed_checks = speed_check(runner, baseline, survivors, rounds=settings.rounds,
                                               progress=progress, rule=sequential.Ranking(), held=pool,
                                               room=settings.room)
        log.append(_speed_record(base_speed, speed_checks))
    # else nothing is left to measure: the baseline is emitted, at its search value
    for cfg, check in zip(survivors, speed_checks):
        # the ranking records its figures in the speed check's too (verdict.rank_by_rounds)
        by_cfg[cfg].speed = CandidateSpeed.from_check(check)
        by_cfg[cfg].checks["speed"] = check
        speed = by_cfg[cfg].speed
        if settings.pricing is not None and check.passed and speed is not None:  # and over the planned run?
            assert base_speed is not None
            by_cfg[cfg].checks["plan"] = plan_check(settings.pricing, cfg, speed, baseline=baseline,
                                                    base_rate=base_speed.median_samples_per_s)
    verdicts = list(by_cfg.values())
    ranked = [v for v in rank_by_rounds(verdicts, settings.pricing) if v.passed]
    simpler: Verdict | None = None
    # the ablation holds the winner again, and the baseline for the path
    pool.close(keeping=([baseline] if settings.path else []) + ([ranked[0].config] if ranked else []))
    if ranked and settings.ablation and _ablation_fits(settings, ranked[0].config, baseline, len(survivors)):
        assert base_speed is not None  # the survivors were measured
        measured = {baseline: list(base_speed.samples_per_s),
                    **{v.config: list(v.speed.samples_per_s) for v in verdicts
                       if v.speed is not None and v.speed.samples_per_s}}
        simpler = ablate(runner, ranked[0], baseline, settings=settings,
                         speed_windows=settings.rounds * (len(survivors) + 1), progress=progress,
                         measured=measured, trainings=trainings, pool=pool)
        found = ranked[0].ablation
        if found is not None and found.rounds is not None:
            log.append(StageRecord(stage=Stage.ABLATION, ran=found.rounds, cap=found.cap, stopped=found.stopped))
        if simpler is not None:
            verdicts.append(simpler)
            ranked.insert(0, simpler)
    elif ranked and settings.ablation and settings.budget is not None:
        ranked[0].ablation = Ablation(skipped=f"skipped {settings.budget.why}")
        log.append(StageRecord(stage=Stage.ABLATION, shortened=f"skipped {settings.budget.why}"))
    pool.close()  # the scripts run alone on the machine
    base_script: standalone.Script | None = None
    for i, verdict in enumerate(ranked[:settings.standalone_attempts]):
        if i and not _pairs_fit(settings):
            assert settings.budget is not None
            log.append(StageRecord(stage=Stage.STANDALONE, config=verdict.config.short(),
                                   shortened=f"not run alone {settings.budget.why}"))
            break
        speed = verdict.speed
        assert base_speed is not None and speed is not None  # ranked: measured side by side
        if base_script is None:
            base_script = standalone.Script(emit_candidate(baseline, workdir / "baseline"), baseline,
                                            base_speed.median_samples_per_s)
        cfg = verdict.config
        progress(ProgressEvent.STEP, VerifyStep(f"the generated script of {cfg.short()}, run alone against "
                                                "the baseline's", stage=Stage.STANDALONE.value))
        folder = workdir / f"candidate-{i}"
        script = standalone.Script(emit_candidate(cfg, folder), cfg, speed.median_samples_per_s)
        verdict.checks["standalone"] = standalone.check(
            runner, baseline=base_script, candidate=script, served=speed,
            served_baseline=base_speed, settings=settings, workdir=folder / "standalone",
            progress=progress)
        alone = verdict.standalone
        if alone is not None:
            log.append(StageRecord(stage=Stage.STANDALONE, ran=alone.speedup.pairs, cap=alone.cap,
                                   stopped=alone.stopped, config=cfg.short()))
        if verdict.passed:
            if simpler is not None and verdict is not simpler:
                verdict.ablation = _simplified_failed(simpler)
            return verdict, verdicts, base_speed
    return None, verdicts, base_speed


def _speed_record(base_speed: ReferenceSpeed, checks: list[Check]) -> StageRecord:
    dropped = [s.interval.rounds or 0 for c in checks
               if (s := CandidateSpeed.from_check(c)) is not None and s.stopped]
    return StageRecord(stage=Stage.SPEED, ran=base_speed.rounds, cap=base_speed.cap,
                       stopped=base_speed.stopped,
                       dropped=(f"{len(dropped)} candidate{'s' if len(dropped) > 1 else ''} measured no more "
                                f"after {min(dropped)} rounds: clearly slower than the leader") if dropped else None)


def _ablation_fits(settings: Settings, top: TrialConfig, baseline: TrialConfig, survivors: int) -> bool:
    """Whether what --timeout leaves still holds the ablation and the pairs after it."""
    budget = settings.budget
    if budget is None:
        return True
    held = ablation.session_configs(top, baseline, pinned=settings.pinned, path=settings.path)
    rounds = ablation.rounds_for(len(held), speed_windows=settings.rounds * (survivors + 1))
    need = (budget.costs.side_by_side([top, *held], rounds, settings.room)
            + budget.costs.pairs(settings.pairs, settings.pair_seconds, ahead=settings.ahead([baseline, top])))
    return budget.left() >= need


def _pairs_fit(settings: Settings) -> bool:
    """Whether what --timeout leaves holds another candidate's pairs, at their fewest."""
    budget = settings.budget
    return budget is None or budget.left() >= budget.costs.pairs(
        min(sequential.PAIRS_FEWEST, settings.pairs), settings.pair_seconds)


def _simplified_failed(simplified: Verdict) -> Ablation | None:
    """The ablation that goes with the winner (with every knob) when the simplified
    configuration did not pass alone: the knobs worth nothing measurable were kept."""
    found = simplified.ablation
    if found is None:
        return None
    kept_anyway = ("not shown to help, but kept: the configuration without it did not pass "
                   "when run alone")
    knobs = tuple(k if k.kept else dataclasses.replace(k, note=kept_anyway) for k in found.knobs)
    path = found.path
    if path is not None and path.steps and path.total is not None:
        path = dataclasses.replace(path, steps=tuple(dataclasses.replace(s, kept=True) for s in path.steps),
                                   kept_product=path.total.ratio)
    marked = dataclasses.replace(found.simplified or Simplified(config=simplified.config.short()),
                                 rejected=simplified.reason)
    return dataclasses.replace(found, knobs=knobs, path=path, simplified=marked)
