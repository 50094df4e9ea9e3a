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
from typing import Any

from autotune.config import TrialConfig
from autotune.document.ablation import Ablation, Simplified
from autotune.document.measures import CandidateOutcome, Check, Standalone
from autotune.document.stages import Stage, StageRecord
from autotune.options import RunOptions
from autotune.runtime.knobs import Precision
from autotune.search import memory
from autotune.search.objective import Pricing
from autotune.trials.protocol import Failure, Progress, ProgressEvent, Status
from autotune.trials.runner import TrialResult, TrialRunnerLike
from autotune.verify import ablation, sequential, standalone
from autotune.verify.batch import batch_check
from autotune.verify.deadline import Budget
from autotune.verify.device_room import DeviceRoom
from autotune.verify.side_by_side import Held, relative_to_level, speed_check
from autotune.verify.trainings import Trainings, metrics

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
# What evaluate() may lose to reduced precision when --max-quality-drop is not given:
# this share of the fp32 reference's metric (higher is better).
PRECISION_QUALITY_DROP = 0.02
REDUCED_PRECISIONS = (Precision.BF16, Precision.FP16, Precision.TF32)


def numerics_reference(baseline: TrialConfig, cand: TrialConfig) -> TrialConfig:
    """fp32, eager, default threads, at the candidate's batch size and pruning: what the
    candidate must compute the same as. On CPU one process; on GPUs the candidate's own
    ranks, since one GPU may not hold the global batch that eight hold (fp32 ranks and
    one process agree to rounding: the global batches are the same)."""
    ref = baseline.replace(batch_size=cand.batch_size, prune_ratio=cand.prune_ratio)
    if cand.device == "cuda" and cand.nprocs > 1:
        ref = ref.replace(nprocs=cand.nprocs, threads=cand.threads)
    return ref


def smaller_batch(cfg: TrialConfig) -> int | None:
    """Half ``cfg``'s global batch, when its ranks still split it; None when it cannot shrink."""
    half = cfg.batch_size // 2
    return half if half >= cfg.nprocs and half % cfg.nprocs == 0 else None


def _out_of_memory(result: TrialResult) -> bool:
    return result.status != Status.OK and result.failure == Failure.OUT_OF_MEMORY


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


def _where_fp32_fits(run: Callable[[TrialConfig, str], TrialResult], ref: TrialConfig,
                     cand: TrialConfig) -> tuple[dict[str, TrialResult], TrialConfig, list[str]]:
    """Run the fp32 reference, then the candidate (``run(cfg, role)``). Where the reference
    runs out of memory at the candidate's batch (reduced precision holds larger batches),
    both go to half the batch, until fp32 fits: what a reference checks is the knob's
    effect on the arithmetic, at the largest batch fp32 holds. Returns the results (no
    candidate's when the reference failed), the candidate as run, and why it shrank."""
    notes: list[str] = []
    while True:
        results = {"reference": run(ref, "reference")}
        half = smaller_batch(cand)
        held = memory.holding_as(ref, cand) if _out_of_memory(results["reference"]) else None
        if held is not None:
            notes.append(f"the fp32 reference ran out of memory at batch {cand.batch_size}: it ran with "
                         f"the candidate's {' and '.join(memory.knobs_on(cand))}, which compute the same "
                         "to rounding")
            ref = held
            continue
        if _out_of_memory(results["reference"]) and half is not None:
            notes.append(f"the fp32 reference ran out of memory at batch {cand.batch_size}")
            ref, cand = ref.replace(batch_size=half), cand.replace(batch_size=half)
            continue
        if results["reference"].status == Status.OK:
            results["candidate"] = run(cand, "candidate")
        return results, cand, notes


def trades_quality(cand: TrialConfig) -> bool:
    """Whether a knob of ``cand`` trades quality: the quality check scores it."""
    return cand.prune_ratio > 0 or cand.precision in REDUCED_PRECISIONS


def numerics_check(trainings: Trainings, baseline: TrialConfig, cand: TrialConfig) -> Check:
    """The candidate's first ``trainings.numerics_steps`` losses against its reference's,
    which runs where fp32 fits (``_where_fp32_fits``). Where a knob trades quality, or
    evaluate() will judge a batch unlike the user's (``verify.batch``), the trainings are
    scored, and those checks then read them without training again."""
    quality = trades_quality(cand)
    scored = {"reference": quality,
              "candidate": quality or (trainings.evaluate and cand.batch_size != baseline.batch_size)}
    results, ran, notes = _where_fp32_fits(lambda cfg, role: trainings.of(cfg, role, scored=scored[role]),
                                           numerics_reference(baseline, cand), cand)
    shrunk = {"checked_at_batch": ran.batch_size, "notes": notes} if notes else {}
    for role, result in results.items():
        if result.status != Status.OK:
            what = "the fp32 reference" if role == "reference" else "the candidate"
            return Check(False, {"reason": f"{what} failed: {result.describe_failure()}", **shrunk})
    steps = trainings.numerics_steps
    check = compare_losses(results["reference"].losses[:steps], results["candidate"].losses[:steps],
                           tolerance=NUMERICS_TOLERANCE[cand.precision],
                           max_lag=FP16_MAX_LAG if cand.precision == Precision.FP16 else 0)
    reference = numerics_reference(baseline, ran)
    return dataclasses.replace(check, detail={
        **check.detail, "reference": {"layout": reference.layout, "batch_size": ran.batch_size},
        **shrunk})


def quality_reference(baseline: TrialConfig, cand: TrialConfig) -> TrialConfig:
    """What the quality check compares against: the numerics check's reference, unpruned.
    Only the knobs that trade quality differ; a larger batch is not judged here (it
    changes training dynamics, not what a step computes)."""
    return numerics_reference(baseline, cand).replace(prune_ratio=0.0)


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
    results, ran, notes = _where_fp32_fits(lambda cfg, role: trainings.of(cfg, role, scored=True),
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


def describe_checks(verdict: Verdict) -> str:
    """One line on how a configuration's precision was checked, for the summary."""
    cfg = verdict.config
    what = {Precision.FP32: "fp32", Precision.TF32: "tf32 matmuls", Precision.BF16: "bf16 autocast",
            Precision.FP16: "fp16 autocast with GradScaler"}[Precision(cfg.precision)]
    if cfg.prune_ratio:
        what += f", {cfg.prune_ratio:.0%} of channels pruned"
    if cfg.optimizer_step != "default":  # rounding only: checked against the default step's losses
        what += f", {cfg.optimizer_step} optimizer step"
    if cfg.float8:  # judged as bf16 is: against the fp32 reference, and by evaluate()
        what += ", float8 matmuls"
    parts = []
    numerics = verdict.checks.get("numerics")
    if numerics is not None and numerics.passed:
        d = numerics.detail
        ref = d.get("reference") or {}
        where = ("one-process" if ref.get("layout", "1x").startswith("1x")
                 else f"{ref['layout'].split('x')[0]}-rank")
        parts.append(f"losses tracked the fp32 {where} reference within "
                     f"{d['max_difference']:.1%} over {d['steps']} steps"
                     + (f" (at batch {d['checked_at_batch']}, where fp32 fits)"
                        if d.get("checked_at_batch") else ""))
    quality = verdict.checks.get("quality")
    if quality is not None and quality.passed:
        d = quality.detail
        parts.append(f"evaluate() {d['candidate_metric']:.4g} vs {d['reference_metric']:.4g} in fp32")
    elif quality is not None and quality.passed is None and not cfg.exact:
        parts.append("no evaluate() to check quality with")
    return f"{what}: " + ("; ".join(parts) if parts else "not checked")


def rank_by_rounds(verdicts: list[Verdict], pricing: Pricing | None = None) -> list[Verdict]:
    """Fastest first, judged round by round against the candidates' own level
    (``side_by_side.relative_to_level``), not against the baseline's window. Those the
    speed check stopped as clearly slower than the leader are judged against the same
    level in their rounds and come after the ones it measured to the end; those whose
    re-measurement failed last. With a planned run (``pricing``), shortest predicted run
    first: the same rates, and each one's one-time cost from the search."""
    measured = [v for v in verdicts if v.speed.get("samples_per_s")]
    if not measured:
        return list(verdicts)
    stopped = [v for v in measured if v.speed.get("stopped")]
    to_the_end = [v for v in measured if v not in stopped] or stopped
    beside = [v for v in stopped if v not in to_the_end]
    relative = relative_to_level([v.speed["samples_per_s"] for v in to_the_end],
                                 beside=[v.speed["samples_per_s"] for v in beside])
    for v, r in zip([*to_the_end, *beside], relative):
        v.speed["relative_to_candidates"] = r
    if pricing is not None:  # search.objective: compiling's one-time cost counts
        pricing.price([(v.config, v.speed) for v in measured])
        return sorted(verdicts, key=lambda v: v.speed.get("planned_s", math.inf))
    return sorted(verdicts, key=lambda v: (v in to_the_end, v.speed.get("relative_to_candidates", 0.0)),
                  reverse=True)


def outcomes(verdicts: list[Verdict], winner: Verdict | None,
             pricing: Pricing | None = None) -> list[CandidateOutcome]:
    """Every candidate's re-measured speed and what became of it, in the order they were
    tried: with the passed-but-not-chosen ones kept, the verification order can be
    audited afterwards (which candidate a different order would have emitted)."""
    out = []
    for v in rank_by_rounds(verdicts, pricing):
        if v is winner:
            outcome = "emitted"
        elif not v.passed:
            outcome = f"rejected: {v.reason}"
        elif winner is not None:  # verification stops at the first to pass them all
            outcome = "faster than the baseline; not checked further, one tried earlier was emitted"
        else:
            outcome = ("faster side by side; its script was not run alone (verification runs "
                       "the scripts of the fastest few only)")
        out.append(CandidateOutcome(
            config=v.config, speed={k: v.speed.get(k) for k in CandidateOutcome.SPEED_KEYS},
            checks=tuple(sorted(v.checks)), outcome=outcome))
    return out


@dataclasses.dataclass
class Settings:
    rounds: int = RunOptions.rounds  # the most side-by-side rounds (sequential rules stop earlier)
    numerics_steps: int = 40
    quality_samples: int = 6400
    max_quality_drop: float | None = RunOptions.max_quality_drop
    script_timeout_s: float = 300.0  # one standalone run of a script, warm-up included
    pairs: int = RunOptions.pairs  # the most standalone pairs: each runs both scripts once
    pair_seconds: float = RunOptions.pair_seconds  # timed training per standalone run
    standalone_attempts: int = 2  # candidates whose scripts run alone, fastest first
    replacements: int = 2  # per kind (exact, reduced) for candidates the gates reject
    ablation: bool = True  # measure each knob's worth and drop those worth nothing
    path: bool = False  # and the path from the baseline, one knob added at a time
    pinned: frozenset[str] = frozenset()  # knobs the user fixed: never ablated or dropped
    pricing: Pricing | None = None  # the planned run (--train-steps, --epochs), if any
    budget: Budget | None = None  # what --timeout leaves, where it was given (autotune.verify.fit)
    # whether a configuration is known to fit in memory (search.memory.known_to_fit): the
    # ablation drops no knob without which it is not
    fits: Callable[[TrialConfig], bool] = lambda cfg: True
    # what verification may hold on the GPUs at once (autotune.verify.device_room)
    room: DeviceRoom | None = None


@dataclasses.dataclass
class Verdict:
    config: TrialConfig
    checks: dict[str, Check]
    speed: dict[str, Any]
    ablation: Ablation | None = None  # the knob-by-knob measurement that shaped it

    @property
    def passed(self) -> bool:
        return all(c.passed is not False for c in self.checks.values())

    @property
    def reason(self) -> str:
        return "; ".join(f"{name}: {c.detail.get('reason', 'failed')}"
                         for name, c in self.checks.items() if c.passed is False)

    @property
    def standalone(self) -> Standalone | None:
        """The standalone pairs' figures (what is printed), once they ran."""
        return Standalone.from_check(self.checks.get("standalone"))


def gate(trainings: Trainings, baseline: TrialConfig, cfg: TrialConfig, *, settings: Settings) -> Verdict:
    """The checks that need no speed measurement, numerics then quality, from one short
    training of the candidate and one of its reference (``trainings``), then the batch
    check where its batch is not the user's."""
    verdict = Verdict(cfg, {}, {})
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
        progress(ProgressEvent.STEP, {"text": f"numerics and quality of {cfg.short()}"})
        verdict = gate(trainings, baseline, cfg, settings=settings)
        verdicts.append(verdict)
        if verdict.passed:
            passed.append(cfg)
            continue
        progress(ProgressEvent.STEP, {"text": f"rejected {cfg.short()}: {verdict.reason}"})
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
    return passed, verdicts


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
    progress(ProgressEvent.STEP, {"text": f"numerics and quality of the simplified {simpler.short()}"})
    verdict = gate(trainings, baseline, simpler, settings=settings)
    if not verdict.passed:
        top.ablation = dataclasses.replace(
            top.ablation, simplified=Simplified(config=simpler.short(), rejected=verdict.reason))
        return None
    # Its side-by-side speed: the variant's where one knob went, else the winner's (the
    # ablation found the dropped knobs worth nothing measurable).
    dropped = tuple(k.knob for k in top.ablation.knobs if not k.kept)
    verdict.speed = dict(top.speed)
    verdict.ablation = dataclasses.replace(
        top.ablation, simplified=Simplified(config=simpler.short(), dropped=dropped, from_=cfg.short()))
    return verdict


def verify_candidates(
    runner: TrialRunnerLike, *, baseline: TrialConfig, candidates: list[TrialConfig],
    settings: Settings, has_evaluate: bool,
    emit_candidate: Callable[[TrialConfig, Path], Path], workdir: Path,
    reserve: Sequence[TrialConfig] = (),
    progress: Progress = lambda kind, info: None,
    stages: list[StageRecord] | None = None, slowest: float | None = None,
) -> tuple[Verdict | None, list[Verdict], dict[str, Any]]:
    """Gate the candidates (numerics, quality; ``screen``), measure the survivors'
    speed side by side with the baseline, then run the scripts of the fastest first
    alone against the baseline's (at most ``settings.standalone_attempts``); the first
    to pass all four checks wins (the simplified one of ``ablate`` first, when there is
    one). ``emit_candidate(cfg, folder)`` writes a candidate's launch.sh and returns its
    path. Each stage's record (``StageRecord``) is appended to ``stages``. ``slowest``: the
    slowest samples/s the search measured, which sizes the gates' trainings' time limits."""
    log = stages if stages is not None else []
    trainings = Trainings(runner, evaluate=has_evaluate, numerics_steps=settings.numerics_steps,
                          quality_samples=settings.quality_samples, slowest=slowest)
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
            trainings: Trainings, pool: Held) -> tuple[Verdict | None, list[Verdict], dict[str, Any]]:
    if baseline.device != "cuda":
        # started while the gates train (which measures nothing): ready by the speed check.
        # Not on GPUs, where they would take device memory from the gates' trainings.
        pool.start([baseline, *candidates])
    survivors, gated = screen(trainings, baseline, candidates, list(reserve), settings=settings,
                              progress=progress)
    by_cfg = {v.config: v for v in gated}
    pool.close(keeping=[baseline, *survivors])
    if survivors:
        base_speed, speed_checks = speed_check(runner, baseline, survivors, rounds=settings.rounds,
                                               progress=progress, rule=sequential.Ranking(), held=pool,
                                               room=settings.room)
        log.append(_speed_record(base_speed, speed_checks))
    else:  # nothing left to measure: the baseline is emitted, at its search value
        base_speed, speed_checks = {}, []
    for cfg, check in zip(survivors, speed_checks):
        # one dict: the ranking's relative speed is recorded in the speed check too
        by_cfg[cfg].speed = dict(check.detail)
        by_cfg[cfg].checks["speed"] = Check(check.passed, by_cfg[cfg].speed)
        if settings.pricing is not None and check.passed:  # faster per step: and over the planned run?
            by_cfg[cfg].checks["plan"] = settings.pricing.check(cfg, check.detail, baseline=baseline,
                                                                base_speed=base_speed)
    verdicts = list(by_cfg.values())
    ranked = [v for v in rank_by_rounds(verdicts, settings.pricing) if v.passed]
    simpler: Verdict | None = None
    # the ablation holds the winner again, and the baseline for the path
    pool.close(keeping=([baseline] if settings.path else []) + ([ranked[0].config] if ranked else []))
    if ranked and settings.ablation and _ablation_fits(settings, ranked[0].config, baseline, len(survivors)):
        measured = {baseline: base_speed["samples_per_s"],
                    **{v.config: v.speed["samples_per_s"] for v in verdicts if v.speed.get("samples_per_s")}}
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
        if base_script is None:
            base_script = standalone.Script(emit_candidate(baseline, workdir / "baseline"), baseline,
                                            base_speed["median_samples_per_s"])
        cfg = verdict.config
        progress(ProgressEvent.STEP, {"text": f"the generated script of {cfg.short()}, run alone against "
                                  "the baseline's"})
        folder = workdir / f"candidate-{i}"
        script = standalone.Script(emit_candidate(cfg, folder), cfg,
                                   verdict.speed["median_samples_per_s"])
        verdict.checks["standalone"] = standalone.check(
            runner, baseline=base_script, candidate=script, served=verdict.speed,
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


def _speed_record(base_speed: dict[str, Any], checks: list[Check]) -> StageRecord:
    dropped = [c.detail["rounds"] for c in checks if c.detail.get("stopped")]
    return StageRecord(stage=Stage.SPEED, ran=base_speed["rounds"], cap=base_speed["cap"],
                       stopped=base_speed.get("stopped"),
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
            + budget.costs.pairs(settings.pairs, settings.pair_seconds))
    return budget.left() >= need


def _pairs_fit(settings: Settings) -> bool:
    """Whether what --timeout leaves holds another candidate's pairs, at their fewest."""
    budget = settings.budget
    return budget is None or budget.left() >= budget.costs.pairs(
        min(sequential.FEWEST, settings.pairs), settings.pair_seconds)


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
