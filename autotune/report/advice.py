"""Plain-language advice from a finished run: what won and by how much, what each knob
contributed, what the search tried and lost, what was skipped here and what other
hardware would open up.

Every line is derived from measurements in best_config.json and the Optuna study; none is
a rule of thumb. ``autotune show`` prints the lines after the summary and the report
(``autotune.report.files``) lists them, so both say the same thing.
"""
from __future__ import annotations

import statistics
import warnings
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.config import Layout, TrialConfig
from autotune.document.interval import Interval
from autotune.document.run import RunDocument
from autotune.report import profile
from autotune.search.study import quiet_optuna
from autotune.task.objective import duration
from autotune.trials.protocol import StudyAttr

# What other hardware or software would add to the search, keyed by the space's
# "knob[=value]" exclusion and a fragment of its reason (so "--exact keeps fp32", a choice
# and not a limit of the machine, maps to nothing). One place: keep it short.
_GPU = ("on an NVIDIA GPU, the search would run there: NCCL ranks, pinned memory, fp16 autocast "
        "with a GradScaler and, from Ampere on, bf16 autocast and tf32 matmuls")
ELSEWHERE: tuple[tuple[str, str, str], ...] = (
    ("device=cuda", "no NVIDIA GPU", _GPU),
    ("device=cuda", "cannot use them", "with a CUDA build of torch, the GPUs of this machine would be searched"),
    ("precision=fp16", "CUDA GPU", _GPU),
    ("precision=tf32", "NVIDIA GPU", _GPU),
    ("precision=bf16", "avx512_bf16", "on a CPU with AMX or avx512_bf16 (Intel Sapphire Rapids or later, "
                                      "AMD Zen 4 or later), bf16 autocast would be searched"),
    ("precision=bf16,tf32", "Ampere", "on an Ampere or later GPU (A100, H100, RTX 30 series on), bf16 "
                                      "autocast and tf32 matmuls would be searched"),
    ("compile", "compiler", "with a working C++ compiler (e.g. apt-get install g++), torch.compile "
                            "would be tried on the best configurations"),
    ("allocator=jemalloc", "not found", "with jemalloc installed (apt-get install libjemalloc2), it "
                                        "would be tried as the allocator"),
    ("allocator=tcmalloc", "not found", "with tcmalloc installed (apt-get install google-perftools), it "
                                        "would be tried as the allocator"),
    ("backend=ccl", "not installed", "with oneccl_bindings_for_pytorch installed, the oneCCL backend would "
                                     "be tried for several ranks"),
    ("ipex", "not installed", "with intel-extension-for-pytorch installed (matching your torch), its "
                              "optimisations would be tried"),
    ("nprocs>1", "one usable core", "with more usable cores (a larger CPU quota or affinity), several "
                                    "ranks would be tried"),
)


def shown(value: Any) -> str:
    """A knob's value as the user reads it: "default" where autotune leaves PyTorch's
    own default (None), on/off for switches."""
    if value is None:
        return "default"
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def knob_value(config: Mapping[str, Any], knob: str) -> Any:
    """One knob of a TrialConfig dict (as the study stores it) as the search space names
    it: ``layout`` is ranks x threads ("2x1", "1xdefault"), every other knob is the field itself."""
    if knob == "layout":
        return str(Layout(int(config.get("nprocs", 1)), config.get("threads")))
    return config.get(knob)


def _changes(cfg: TrialConfig, base: TrialConfig) -> list[str]:
    """"knob before -> after" for each knob the configuration changes, layout as one."""
    config, baseline = cfg.to_dict(), base.to_dict()
    out = []
    if (cfg.nprocs, cfg.threads) != (base.nprocs, base.threads):
        out.append(f"layout {knob_value(baseline, 'layout')} -> {knob_value(config, 'layout')}")
    for key, value in config.items():
        if key not in ("nprocs", "threads") and baseline.get(key) != value:
            out.append(f"{key} {shown(baseline.get(key))} -> {shown(value)}")
    return out


def outcome_lines(doc: RunDocument) -> list[str]:
    """What won, against what, and by how much (the standalone pairs' interval)."""
    base = doc.baseline
    if doc.speedup is None:
        lines = [f"No configuration was verified faster than the baseline ({base.samples_per_s:,.0f} "
                 "samples/s): keep training as you do today."]
        lines += [f"  rejected {r.config.short()}: {r.reason}" for r in doc.rejected]
        return lines
    sp, iv = doc.speedup, doc.speedup.interval
    level = f", {iv.level:.0%}" if iv.level else ""
    lines = [f"The tuned configuration trains at {iv.ratio:.2f}x the baseline's speed "
             f"({iv.low:.2f}-{iv.high:.2f}x{level}): "
             f"{doc.best.samples_per_s if doc.best else 0:,.0f} against {base.samples_per_s:,.0f} samples/s."]
    if sp.covers:
        lines.append(f"  the interval is {sp.covers}")
    if sp.unsteady:
        lines.append(f"  note: {sp.unsteady}")
    changes = _changes(doc.config, base.config)
    lines.append("Changed from the baseline: " + (", ".join(changes) if changes else "nothing") + ".")
    return lines


def ablation_lines(doc: RunDocument) -> list[str]:
    """Per knob, the winner's speed over the winner with that knob put back to the
    baseline's value (above 1: the knob helps); knobs without a measurable effect are
    named as removed."""
    ablation = doc.ablation
    if ablation is None:
        return []
    if ablation.skipped:
        return [f"What each knob contributed was not measured: {ablation.skipped}"]
    if not ablation.knobs:
        return []
    rounds = f", {ablation.rounds} rounds side by side" if ablation.rounds else ""
    lines = [f"What each change is worth (the winner against itself with that one knob at the "
             f"baseline's value{rounds}; above 1.00x the knob helps):"]
    for k in ablation.knobs:
        name, before, after, e = k.knob, shown(k.baseline), shown(k.winner), k.effect
        if e is None:
            lines.append(f"  {name} {before} -> {after}: {k.note or 'not measured'}; kept")
        elif not k.kept and "but kept" in k.note:
            lines.append(f"  {name} ({_span(e)}): {k.note}")
        elif not k.kept:
            effect = "slows the winner down" if e.high < 1.0 else "no measurable effect"
            lines.append(f"  {name} {before} -> {after}: {effect} ({e.ratio:.2f}x, {_span(e)}): "
                         "removed from the emitted configuration")
        else:
            note = f"; {k.note}" if k.note else ""
            lines.append(f"  {name} {before} -> {after}: {e.ratio:.2f}x ({_span(e)}) of the winner's speed{note}")
    return lines + path_lines(doc)


def path_lines(doc: RunDocument) -> list[str]:
    """The path from the baseline to the winner, one knob added at a time: each step's
    ratio is that knob's worth given the ones before it, and the steps multiply to the
    whole; the kept steps' product is checked against the verified speedup."""
    found = doc.ablation.path if doc.ablation is not None else None
    if found is None:
        return ["  the path from the baseline, each knob added to those before it, is measured with --path"
                ] if doc.ablation is not None and doc.ablation.knobs else []
    if found.skipped:
        return [f"  the path from the baseline was not measured: {found.skipped}"]
    total = found.total
    if not found.steps or total is None:
        return []
    lines = [f"Step by step from the baseline (each knob added to those before it, "
             f"{found.rounds} rounds side by side; the steps multiply to the whole):"]
    for step in found.steps:
        change = ", ".join(f"{k} {shown(b)} -> {shown(w)}"
                           for k, b, w in zip(step.knobs, step.baseline, step.winner))
        removed = "" if step.kept else " (removed from the emitted configuration)"
        lines.append(f"  + {change}: {step.effect.ratio:.2f}x ({_span(step.effect)}){removed}")
    speed = doc.speedup
    held = speed.side_by_side if speed is not None else None
    whole = f"  = {total.ratio:.2f}x ({_span(total)}), the winner over the baseline side by side"
    if held is not None and held.low:
        # Two measurements of one ratio, each with its noise: they agree where their
        # intervals meet, not only where one's point falls in the other's interval.
        overlap = total.low <= held.high and held.low <= total.high
        whole += (f"; the speed check measured it at {held.ratio:.2f}x ({_span(held)}): "
                  + ("consistent, the intervals overlap" if overlap
                     else "the intervals do not overlap (the machine's speed changed between the two?)"))
    lines.append(whole)
    if speed is not None and speed.pairs:
        product, alone_iv = found.kept_product, speed.interval
        alone = alone_iv.low <= product <= alone_iv.high
        which = ("the kept knobs' steps multiply to" if any(not s.kept for s in found.steps)
                 else "the steps multiply to")
        line = (f"  {which} {product:.2f}x; the emitted configuration's script run alone against the "
                f"baseline's: {alone_iv.ratio:.2f}x ({_span(alone_iv)}): {'inside' if alone else 'outside'}")
        if not alone and held is not None and held.ratio:
            line += (f" (on this machine the speedup measured side by side is "
                     f"{held.ratio / alone_iv.ratio:.2f}x the one measured alone, and the steps are "
                     "measured side by side)")
        lines.append(line)
    loo = doc.ablation.product if doc.ablation is not None else None
    if loo and total.ratio and not 0.9 <= loo / total.ratio <= 1.1:
        why = ("complement each other: each removal costs more than its share" if loo > total.ratio
               else "overlap: each removal costs less than its share, the others make up for it")
        lines.append(f"  the leave-one-out ratios above multiply to {loo:.2f}x instead: the knobs {why}")
    return lines


def plan_lines(doc: RunDocument) -> list[str]:
    """The run the user plans: its predicted wall time with the emitted configuration and
    with the baseline (one-time costs as the search measured them, rates as verification
    did), and after how many steps each compiled configuration pays for its compiling."""
    planned = doc.plan
    if planned is None:
        return []
    base, chosen = planned.baseline, planned.chosen
    lines = [f"The run you plan, {planned.plan.describe()} ({planned.plan.samples:,} samples), "
             f"is predicted to take {duration(chosen.predicted_s)} with the emitted configuration "
             f"({duration(chosen.one_time_s)} of it one-time) and {duration(base.predicted_s)} with the "
             f"baseline ({duration(base.one_time_s)} one-time); configurations were ranked by it."]
    if doc.config == doc.baseline.config:
        lines[0] = (f"The run you plan, {planned.plan.describe()} ({planned.plan.samples:,} samples), is "
                    f"predicted to take {duration(base.predicted_s)} with the baseline "
                    f"({duration(base.one_time_s)} of it one-time); configurations were ranked by it.")
    if planned.break_even:
        lines += ["Compiling against the same configuration eager, as the search measured them:",
                  *(f"  {line}" for line in planned.lines())]
    elif "compile" not in doc.excluded:
        lines.append("No compiled configuration was measured in the search: no break-even for compiling.")
    return lines


def _span(effect: Interval) -> str:
    return f"{effect.low:.2f}-{effect.high:.2f}"


def completed(study: optuna.Study) -> list[FrozenTrial]:
    """Completed, measured trials carrying their configuration (a trial that repeats an
    earlier configuration is a copy of its value and counts once)."""
    return [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
            if t.value is not None and t.user_attrs.get(StudyAttr.CONFIG)
            and t.user_attrs.get(StudyAttr.DUPLICATE_OF) is None]


def steady(t: FrozenTrial) -> float:
    """A completed trial's steady throughput (its median window): its value, except under a
    planned run, where the value is the effective throughput of that run."""
    measured = (t.user_attrs.get(StudyAttr.RESULT) or {}).get("value")
    return float(measured if measured is not None else t.value or 0.0)


def searched_knobs(doc: RunDocument, study: optuna.Study | None = None) -> list[str]:
    """Knobs the search varied: more than one value in the space, else (an older document)
    the study's own parameters."""
    knobs = [k for k, values in doc.included.items() if len(values) > 1]
    if knobs or study is None:
        return knobs
    return sorted({name for t in completed(study) for name in t.params})


def _order(values: Iterable[Any], space: Sequence[Any]) -> list[Any]:
    """Values in the space's order; values outside it after them, by their text."""
    values = list(values)
    known = [v for v in space if v in values]
    return known + sorted((v for v in values if v not in known), key=str)


def throughput_by_value(study: optuna.Study, doc: RunDocument, *,
                        min_values: int = 2) -> dict[str, dict[Any, list[float]]]:
    """Per searched knob, the completed trials' steady throughputs (samples/s, also under a
    planned run, whose effective ones are the trials' values) grouped by that
    knob's value, values in the space's order. Knobs with fewer than ``min_values``
    values completed are left out (with one, there is nothing to compare)."""
    out: dict[str, dict[Any, list[float]]] = {}
    trials = completed(study)
    for knob in searched_knobs(doc, study):
        groups: dict[Any, list[float]] = {}
        for t in trials:
            groups.setdefault(knob_value(t.user_attrs[StudyAttr.CONFIG], knob), []).append(steady(t))
        if len(groups) >= max(1, min_values):
            out[knob] = {v: groups[v] for v in _order(groups, doc.included.get(knob, []))}
    return out


def _tried(study: optuna.Study, knob: str) -> set[str]:
    """The values of ``knob`` any trial ran with (completed, stopped early or failed), as text."""
    return {shown(knob_value(t.user_attrs[StudyAttr.CONFIG], knob)) for t in study.get_trials(deepcopy=False)
            if t.user_attrs.get(StudyAttr.CONFIG) and t.state != TrialState.RUNNING}


def param_importances(study: optuna.Study) -> dict[str, float]:
    """Optuna's estimate of each parameter's share of the throughput's variation, over the
    completed, measured trials; empty when it cannot be computed (fewer than two trials,
    parameters that never vary)."""
    trials = [t for t in completed(study) if t.params]
    if len(trials) < 2 or all(len({repr(t.params.get(p)) for t in trials}) < 2 for p in trials[0].params):
        return {}
    try:
        with warnings.catch_warnings(), quiet_optuna():
            warnings.simplefilter("ignore")
            scratch = optuna.create_study(direction="maximize")  # in memory: the journal is not touched
            scratch.add_trials(trials)
            return {k: float(v) for k, v in optuna.importance.get_param_importances(scratch).items()}
    except Exception:  # optuna raises several kinds for degenerate studies; advice is optional
        return {}


def search_lines(study: optuna.Study, doc: RunDocument) -> list[str]:
    """What the search measured, which knobs mattered, and each knob's best value with how
    the others compared (medians over trials where other knobs varied too: a hint, not a
    controlled measurement like the ablation)."""
    trials = study.get_trials(deepcopy=False)
    if not trials:
        return []
    states = [t.state for t in trials if t.user_attrs.get(StudyAttr.DUPLICATE_OF) is None]
    repeats = len(trials) - len(states)
    lines = [f"The search ran {len(trials)} trials: {states.count(TrialState.COMPLETE)} measured to the end, "
             f"{states.count(TrialState.PRUNED)} stopped early as clearly slower, "
             f"{states.count(TrialState.FAIL)} failed"
             + (f", {repeats} repeated an earlier configuration (not measured again)." if repeats else ".")]
    importances = param_importances(study)
    if importances:
        shares = ", ".join(f"{k} {v:.0%}" for k, v in importances.items())
        lines.append(f"Optuna's estimate of how much each knob mattered ({len(completed(study))} "
                     f"completed trials; rough with few): {shares}.")
    by_value = throughput_by_value(study, doc, min_values=1)
    if by_value:
        lines.append("Median throughput per value (samples/s over completed trials; other knobs varied too):")
    for knob, groups in by_value.items():
        lines.append("  " + _knob_line(knob, groups, study, doc))
    return lines


def _trials(n: int) -> str:
    return f"{n} trial" if n == 1 else f"{n} trials"


def _knob_line(knob: str, groups: dict[Any, list[float]], study: optuna.Study, doc: RunDocument) -> str:
    """One knob's best value by median throughput, the others relative to it, and the
    values of the space that never completed: stopped early or failed, or never tried."""
    medians = {v: statistics.median(xs) for v, xs in groups.items()}
    best = max(medians, key=lambda v: medians[v])
    if len(groups) > 1:
        line = f"{knob}: best {shown(best)} at {medians[best]:,.0f} ({_trials(len(groups[best]))})"
    else:
        line = f"{knob}: only {shown(best)} completed, at {medians[best]:,.0f} ({_trials(len(groups[best]))})"
    others = [f"{shown(v)} {medians[v] / medians[best]:.2f}x ({len(groups[v])})" for v in groups if v != best]
    if others:
        line += f"; against it: {', '.join(others)}"
    done = {shown(v) for v in groups}
    tried = _tried(study, knob)
    space = [shown(v) for v in doc.included.get(knob, [])]
    lost = [v for v in space if v in tried and v not in done] + sorted(tried - done - set(space))
    if lost:
        line += f"; stopped early or failed: {', '.join(lost)}"
    untried = [v for v in space if v not in tried]
    if untried:
        line += f"; not tried in the search: {', '.join(untried)}"
    return line


def skipped_lines(doc: RunDocument) -> list[str]:
    """What the search left out on this machine, and why."""
    excluded = doc.excluded
    if not excluded:
        return []
    return ["Not searched on this machine:"] + [f"  {knob}: {reason}" for knob, reason in excluded.items()]


def elsewhere_lines(doc: RunDocument) -> list[str]:
    """What other hardware or software would add to the search (``ELSEWHERE``), each hint
    once, from the reasons this machine's knobs were left out."""
    excluded = doc.excluded
    hints: list[str] = []
    for key, fragment, hint in ELSEWHERE:
        reason = excluded.get(key)
        if reason is not None and fragment in reason and hint not in hints:
            hints.append(hint)
    return (["On other hardware or with other software:"] + [f"  {hint}" for hint in hints]) if hints else []


def advise(doc: RunDocument, *, study: optuna.Study | None = None,
           in_summary: bool = False) -> list[str]:
    """The advice for a result document (and its study, when given), one plain line each;
    lines beginning with two spaces belong to the line above. ``in_summary=True`` leaves
    out what the summary printed above it already (the ablation, the knobs not searched)."""
    lines = outcome_lines(doc)
    if not in_summary:
        lines += (ablation_lines(doc) + plan_lines(doc) + (doc.memory.lines() if doc.memory else [])
                  + (doc.batch.lines() if doc.batch else []) + (doc.steering.lines() if doc.steering else []))
    lines += profile.advice_lines(doc, workers_tried=_tried(study, "num_workers") if study is not None else None)
    if study is not None:
        lines += search_lines(study, doc)
    if not in_summary:
        lines += skipped_lines(doc)
    return lines + elsewhere_lines(doc)
