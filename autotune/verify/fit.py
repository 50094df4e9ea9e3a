"""Verification fitted to what ``--timeout`` left of the run.

Each stage's cost is estimated from what this run measured (``deadline.Costs``). When the
stages as asked do not fit, they are shortened in this order, each only as far as needed,
and never below what can still verify:

1. the ablation is skipped: it explains the winner and may simplify it, and the emitted
   configuration is verified without it;
2. fewer speed-check rounds, down to ``sequential.FEWEST``;
3. fewer standalone pairs, down to ``sequential.PAIRS_FEWEST``;
4. fewer candidates, down to the first one and, when that one trades precision, the best
   exact one (what the user gets if the gates reject reduced precision);
5. shorter standalone runs, down to as long as a search trial's measured windows: last,
   since short runs undercount a configuration whose DataLoader workers still ramp up.

The gates (numerics, quality) are never shortened: their steps are what their tolerances
were set for. If even the minimum does not fit, the plan says so and verification runs at
the minimum, unless a configuration the search measured verifies within what is left: then
that one is verified alone instead (``fit``'s ``ranked``). Later, the stages themselves look
at the clock: the ablation is skipped when what is left no longer holds it and the pairs, a
second candidate's script is run alone only when its pairs still fit, and the pairs stop
(never below the minimum) once the next one would overrun.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from autotune.config import TrialConfig
from autotune.document.stages import Stage, StageRecord, VerificationStages
from autotune.runtime.knobs import CompileMode
from autotune.trials.runner import process_key
from autotune.verify import ablation
from autotune.verify.deadline import MARGIN, Budget, Costs
from autotune.verify.decide import FEWEST_SEEDS
from autotune.verify.length import within
from autotune.verify.quality import trades_quality
from autotune.verify.reference import numerics_reference, quality_reference, trained_fast, work_key
from autotune.verify.sequential import FEWEST, PAIRS_FEWEST
from autotune.verify.settings import Settings
from autotune.verify.trainings import evaluation_steps, training_steps


@dataclasses.dataclass(frozen=True)
class FittedStages:
    """The stages as fitted: their settings, the candidates to verify, what was shortened
    (by stage, in words), the estimate, the seconds left, ``over`` when even the minimum did
    not fit, and what the estimate holds for the stages after the gates (``after_gates_s``:
    what a gate's extra seed must leave, ``Settings.affords``)."""

    settings: Settings
    candidates: list[TrialConfig]
    shortened: dict[Stage, str]
    estimate_s: float
    left_s: float
    over: str | None = None
    after_gates_s: float = 0.0


def gates_cost(settings: Settings, candidates: Sequence[TrialConfig], *, baseline: TrialConfig,
               costs: Costs, has_evaluate: bool) -> float:
    """One short training per computation (``Trainings``): each candidate's and its
    reference's, shared by what they compute (and, where a knob trades quality, both from
    the other seeds a verdict takes at its fewest, ``decide.FEWEST_SEEDS``), scored where a
    knob trades quality or evaluate() judges a batch unlike the user's (``verify.batch``),
    which also trains the user's configuration over the same samples, and both again from
    the other seeds. More seeds, where a verdict needs them, are taken only where what is
    left holds them (``Settings.affords``). A run whose process knobs differ from the
    run's before it starts a process of its own. A scored training calls evaluate() at its
    ``evaluation_steps`` and at its end (``Costs.evaluate_s`` each); the batch check's run of
    the user's configuration (``Trainings.for_samples``) at its end alone. A computation
    trained unscored and then asked scored is trained again, as ``Trainings.of`` does."""
    seen: dict[tuple[str, int], bool] = {}  # what was trained, and whether scored
    total = 0.0
    last: list[str | None] = [None]  # the process key of the run before: a warm process has it

    def steps(cfg: TrialConfig, scored: bool) -> int:
        return training_steps(cfg, evaluate=scored, numerics_steps=settings.numerics_steps,
                              quality_samples=settings.quality_samples)

    def samples(cfg: TrialConfig, scored: bool) -> int:
        return cfg.batch_size * steps(cfg, scored)

    def run(cfg: TrialConfig, count: float, evaluations: int = 0) -> float:
        key = process_key(cfg)
        fresh, last[0] = key is None or key != last[0], key
        return costs.process(samples=count, fresh=fresh, evaluations=evaluations, rate=costs.rate_of(cfg))

    for cand in candidates:
        quality = has_evaluate and trades_quality(cand)
        judged = has_evaluate and cand.batch_size != baseline.batch_size  # the candidate's run is scored
        # the references on the fastest alike's feeding knobs, as ``Trainings.reference`` trains them
        reference = trained_fast(numerics_reference(baseline, cand), costs.rates)
        trained = [(reference, quality, 0), (cand, quality or judged, 0)]
        if quality:  # the other seeds' pairs, the reference unpruned
            for seed in range(1, FEWEST_SEEDS):
                trained += [(trained_fast(quality_reference(baseline, cand), costs.rates), True, seed),
                            (cand, True, seed)]
        for cfg, scored, seed in trained:
            if seen.get((work_key(cfg), seed)) not in (True, scored):
                seen[work_key(cfg), seed] = scored
                total += run(cfg, samples(cfg, scored),
                             len(evaluation_steps(steps(cfg, scored))) + 1 if scored else 0)
        if judged:  # the user's configuration over the longer of the two, once per length and seed
            over = within(max(samples(baseline, True), samples(cand, True)), settings.own, batch_size=cand.batch_size)
            for seed in range(FEWEST_SEEDS):
                if (f"batch:{over}", seed) not in seen:
                    seen[f"batch:{over}", seed] = True
                    total += run(trained_fast(baseline, costs.rates), over, 1)
                shared = seen.get((work_key(cand), seed)) is True and samples(cand, True) == over
                if seed and not shared and (f"batch:{work_key(cand)}:{over}", seed) not in seen:
                    seen[f"batch:{work_key(cand)}:{over}", seed] = True
                    total += run(cand, over, 1)
    return total


def ablation_cost(settings: Settings, candidates: Sequence[TrialConfig], *, baseline: TrialConfig,
                  costs: Costs) -> float:
    """The first candidate's session (the likeliest winner) and a new trajectory for the
    simplified configuration."""
    if not settings.ablation or not candidates:
        return 0.0
    top = candidates[0]
    held = ablation.session_configs(top, baseline, pinned=settings.pinned, path=settings.path)
    if not held:
        return 0.0
    rounds = ablation.rounds_for(len(held), speed_windows=settings.rounds * (len(candidates) + 1))
    return (costs.side_by_side([top, *held], rounds, settings.room)
            + costs.process(samples=settings.numerics_steps * top.batch_size))


def estimate(settings: Settings, candidates: Sequence[TrialConfig], *, baseline: TrialConfig,
             costs: Costs, has_evaluate: bool) -> dict[Stage, float]:
    """Seconds per stage, with every stage running to its cap (one candidate's pairs). A
    compiled candidate's processes (its gate's training, its held process, its standalone
    runs) each compile it again from the run's cache (``Costs.recompile_s``)."""
    compiled = [c for c in candidates if c.compile != CompileMode.OFF]
    first_compiled = bool(candidates) and candidates[0].compile != CompileMode.OFF
    return {
        Stage.GATES: (gates_cost(settings, candidates, baseline=baseline, costs=costs, has_evaluate=has_evaluate)
                      + len(compiled) * costs.recompile_s),
        Stage.SPEED: (costs.side_by_side([baseline, *candidates], settings.rounds, settings.room)
                      + len(compiled) * costs.recompile_s if candidates else 0.0),
        Stage.ABLATION: ablation_cost(settings, candidates, baseline=baseline, costs=costs),
        Stage.STANDALONE: (costs.pairs(settings.pairs, settings.pair_seconds,
                                       ahead=settings.ahead([baseline, candidates[0]]))
                           + (settings.pairs * costs.recompile_s if first_compiled else 0.0)
                           if candidates else 0.0),
    }


def essential(candidates: Sequence[TrialConfig]) -> list[TrialConfig]:
    """The fewest candidates that can still verify: the first, and the first exact one
    when the first trades precision."""
    if not candidates:
        return []
    first = candidates[0]
    exact = next((c for c in candidates if c.exact), None)
    return [first] if first.exact or exact is None else [first, exact]


def fewer(candidates: Sequence[TrialConfig], count: int) -> list[TrialConfig]:
    """``count`` of the candidates, the essential ones among them, in their order."""
    must = essential(candidates)
    rest = [c for c in candidates if c not in must][:max(0, count - len(must))]
    return [c for c in candidates if c in must or c in rest]


def least(settings: Settings, candidates: Sequence[TrialConfig], *, baseline: TrialConfig,
          costs: Costs, has_evaluate: bool, shortest_run_s: float) -> float:
    """What verification takes at its least, as ``fit`` cuts it when nothing else fits:
    no ablation, the fewest rounds and pairs, the essential candidates, the shortest runs."""
    s = dataclasses.replace(settings, ablation=False, rounds=min(settings.rounds, FEWEST),
                            pairs=min(settings.pairs, PAIRS_FEWEST),
                            pair_seconds=min(settings.pair_seconds, shortest_run_s))
    return sum(estimate(s, essential(candidates), baseline=baseline, costs=costs,
                        has_evaluate=has_evaluate).values())




def fit(settings: Settings, candidates: Sequence[TrialConfig], *, baseline: TrialConfig,
        budget: Budget, has_evaluate: bool, shortest_run_s: float,
        ranked: Sequence[TrialConfig] = ()) -> FittedStages:
    """``settings`` and ``candidates`` shortened, in the module's order, until their
    estimate fits what ``budget`` has left. ``shortest_run_s``: the least timed training
    a standalone run may be cut to. ``ranked``: the search's other configurations, fastest
    first: where even the candidates' least does not fit, the fastest of them whose own
    verification fits is verified alone instead (a batch far from the user's, whose batch
    check trains the user's batch over the candidate's samples from each seed, can take
    longer than the whole --timeout)."""
    left_s, costs, why = budget.left(), budget.costs, budget.why
    left = left_s / MARGIN
    cands = list(candidates)
    s = settings

    def total(s: Settings, cands: list[TrialConfig]) -> float:
        return sum(estimate(s, cands, baseline=baseline, costs=costs, has_evaluate=has_evaluate).values())

    def largest(values: Sequence[int], make: Callable[[int], tuple[Settings, list[TrialConfig]]]
                ) -> tuple[Settings, list[TrialConfig]]:
        """The first of ``values`` (largest first) whose plan fits; else the last."""
        for value in values:
            tried = make(value)
            if total(*tried) <= left:
                return tried
        return make(values[-1])

    shortened: dict[Stage, str] = {}
    if total(s, cands) > left and s.ablation:
        s = dataclasses.replace(s, ablation=False)
        shortened[Stage.ABLATION] = f"skipped {why}"
    if total(s, cands) > left and s.rounds > FEWEST:
        s, cands = largest(range(s.rounds, FEWEST - 1, -1), lambda r: (dataclasses.replace(s, rounds=r), cands))
        if s.rounds < settings.rounds:
            shortened[Stage.SPEED] = f"cut from {settings.rounds} rounds {why}"
    if total(s, cands) > left and s.pairs > PAIRS_FEWEST:
        s, cands = largest(range(s.pairs, PAIRS_FEWEST - 1, -1),
                           lambda n: (dataclasses.replace(s, pairs=n), cands))
    floor = len(essential(cands))
    if total(s, cands) > left and len(cands) > floor:
        s, cands = largest(range(len(cands), floor - 1, -1), lambda k: (s, fewer(candidates, k)))
        shortened[Stage.GATES] = f"{len(cands)} of {len(candidates)} candidates verified {why}"
    if total(s, cands) > left and s.pair_seconds > shortest_run_s:
        ahead = s.ahead([baseline, cands[0]]) if cands else 0
        others = total(s, cands) - costs.pairs(s.pairs, s.pair_seconds, ahead=ahead)
        # the longest runs whose pairs fit what the other stages leave (a setup longer than
        # a run is paid whatever the run's length)
        fits = ((left - others - costs.script_setup_s) / (2 * s.pairs) - (costs.script_start_s - costs.script_setup_s)
                if ahead else (left - others) / (2 * s.pairs) - costs.script_start_s)
        s = dataclasses.replace(s, pair_seconds=round(max(shortest_run_s, min(s.pair_seconds, fits)), 1))
    cuts = [f"cut from {settings.pairs} pairs"] if s.pairs < settings.pairs else []
    if s.pair_seconds < settings.pair_seconds:
        cuts.append(f"runs of {s.pair_seconds:g} s instead of {settings.pair_seconds:g} s")
    if cuts:
        shortened[Stage.STANDALONE] = f"{' and '.join(cuts)} {why}"
    need = total(s, cands)
    gates_s = estimate(s, cands, baseline=baseline, costs=costs, has_evaluate=has_evaluate)[Stage.GATES]
    over = None
    if need > left:
        instead = next((c for c in ranked if c not in cands and total(s, [c]) <= left), None)
        if instead is not None:
            plan = fit(settings, [instead], baseline=baseline, budget=budget, has_evaluate=has_evaluate,
                       shortest_run_s=shortest_run_s)
            said = (f"{instead.short()} verified instead of {cands[0].short() if cands else 'the candidates'}: "
                    f"verifying the candidates at their least takes about {need * MARGIN:.0f} s, past the "
                    f"{max(0.0, left_s):.0f} s left {why}")
            gates_said = "; ".join(filter(None, [said, plan.shortened.get(Stage.GATES)]))
            shortened = {**plan.shortened, Stage.GATES: gates_said}
            return dataclasses.replace(plan, shortened=shortened)
        over = (f"--timeout {budget.timeout_s:g} left {max(0.0, left_s):.0f} s for verification; even at its "
                f"minimum it takes about {need * MARGIN:.0f} s with a margin: verifying at the minimum")
    return FittedStages(settings=s, candidates=cands, shortened=shortened, estimate_s=need, left_s=left_s, over=over,
                        after_gates_s=need - gates_s)


def stages(plan: FittedStages | None, records: Sequence[StageRecord],
           budget: Budget | None) -> VerificationStages | None:
    """The stages' records as they ran, each with what the plan shortened on it (a stage
    the plan left out gets a record of its own), in the order the stages run; None where
    nothing was verified and nothing fitted."""
    if plan is None and not records:
        return None
    out = list(records)
    for stage, why in (plan.shortened if plan is not None else {}).items():
        hits = [i for i, r in enumerate(out) if r.stage is stage]
        for i in hits:
            out[i] = dataclasses.replace(out[i], shortened="; ".join(filter(None, [out[i].shortened, why])))
        if not hits:
            out.append(StageRecord(stage=stage, shortened=why))
    order = list(Stage)
    out.sort(key=lambda r: order.index(r.stage))
    return VerificationStages(
        records=tuple(out), timeout_s=budget.timeout_s if budget is not None else None,
        left_s=round(plan.left_s, 1) if plan is not None else None,
        estimate_s=round(plan.estimate_s, 1) if plan is not None else None,
        over=plan.over if plan is not None else None)
