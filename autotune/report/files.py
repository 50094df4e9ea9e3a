"""The report of a finished run, as files in its output folder: ``report.md`` (plots in
``report/`` beside it) and ``report.html``, one self-contained page (plots inlined, CSS
inline, nothing fetched from anywhere) that opens offline and can be mailed or attached
to a CI job.

Both lead with the answer (the verified speedup and what each knob is worth, see
``autotune.report.render``), then hold the summary (the chosen configuration against the
baseline), the advice (``autotune.report.advice``) and the tables behind it: every trial of
the search, verification's per-round ratios, the ablation. Plots need matplotlib (a dependency of autotune);
without it the tables are all there and the report says how to get the plots. The study
is only read, never written: reading it with ``optuna.create_study(load_if_exists=True)``
would append to the journal.
"""
from __future__ import annotations

import os
import statistics
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.config import KnobValue, TrialConfig
from autotune.document.ablation import Ablation, AblationPath
from autotune.document.interval import Interval
from autotune.document.measures import CandidateOutcome, Rounds, VerifiedSpeedup
from autotune.document.run import RunDocument
from autotune.errors import UsageError
from autotune.report import advice, profile, quality_check
from autotune.report.render import Plot, Table, answers, render_html, render_markdown
from autotune.report.utilisation import utilisation_tables
from autotune.result import read_document
from autotune.search.study import folder_of, load_study
from autotune.task.objective import duration
from autotune.trials.protocol import Failure, Role, StudyAttr

MARKDOWN_NAME = "report.md"
HTML_NAME = "report.html"
PLOTS_DIR = "report"
PLOT_NAMES = ("history.png", "knobs.png", "ablation.png", "path.png", "verification.png", "quality.png")
PLOTS_HINT = "pip install matplotlib"


def write_report(out: str | os.PathLike[str], *, doc: RunDocument | None = None,
                 study: optuna.Study | None = None) -> list[Path]:
    """Write report.md, report.html and (with matplotlib) the plots under report/ into the
    output folder ``out``; returns the files written, report.md and report.html first.
    ``doc`` and ``study`` are read from the folder when not given."""
    folder = folder_of(out)
    doc = doc if doc is not None else read_document(folder)
    notes: list[str] = []
    if study is None:
        try:
            study = load_study(folder, model_file=doc.model_file, fingerprint_id=doc.fingerprint_id)
        except UsageError as exc:
            notes.append(str(exc))
    if study is None and not notes:
        notes.append("No study.journal in the folder: the search's trials are left out.")
    lines = advice.advise(doc, study=study)
    tables = report_tables(doc, study)
    plots = write_plots(folder / PLOTS_DIR, doc, study)
    if plots is None:
        notes.append(f"Plots need matplotlib: {PLOTS_HINT}, then `autotune report {folder}`.")
    md, page = folder / MARKDOWN_NAME, folder / HTML_NAME
    blocks = answers(doc)
    md.write_text(render_markdown(doc, lines, tables, plots or [], notes, base=folder, blocks=blocks))
    page.write_text(render_html(doc, lines, tables, plots or [], notes, blocks=blocks))
    return [md, page, *(p.path for p in plots or [])]


# --- tables ---------------------------------------------------------------------------


def _rate(value: Any) -> str:
    return f"{value:,.0f}" if isinstance(value, (int, float)) else ""


def _interval(item: Interval | Rounds | CandidateOutcome) -> str:
    low, high = (item.low, item.high) if isinstance(item, Interval) else (item.ci_low, item.ci_high)
    return "" if low is None or high is None else f"{low:.2f}-{high:.2f}"


def _facts(doc: RunDocument) -> Table:
    """The headline numbers: what was tuned, how fast before and after, how sure."""
    rows = [["model file", doc.model_file],
            ["verified", "yes" if doc.verified else "no: the baseline is recommended"],
            ["baseline samples/s", _rate(doc.baseline.samples_per_s)]]
    if doc.kept is not None and doc.speedup is None:
        rows.append(["kept, not emitted", f"{doc.kept.config.short()}: {doc.kept.words(None)}"])
    if doc.speedup is not None:
        iv = doc.speedup.interval
        level = f" ({iv.level:.0%})" if iv.level else ""
        lower = doc.speedup.lower_bound
        said = (f"{iv.ratio:.2f}x, interval {_interval(iv)}{level}" if lower is None else
                f"{lower:.2f}x or more in {iv.level:.0%} of re-runs (median {iv.ratio:.2f}x, "
                f"{iv.level:.0%} of re-runs within {_interval(iv)}x)")
        rows += [["tuned samples/s", _rate(doc.best.samples_per_s if doc.best is not None else None)],
                 ["speedup", f"{said}, {doc.speedup.pairs} standalone pairs"]]
        if doc.speedup.speed_shift:
            rows.append(["while verifying", doc.speedup.speed_shift])
    if doc.plan is not None:
        rows.append(["planned run", f"{doc.plan.plan.describe()}: predicted {duration(doc.plan.chosen.predicted_s)}, "
                                    f"the baseline {duration(doc.plan.baseline.predicted_s)}"])
    if doc.launch:
        rows.append(["train with", doc.launch])
    rows += [[f"your script's tuned {doc.script.stack}", doc.script.said() or "yours, unchanged"]] if doc.script else []
    return Table("Result", ["", "value"], rows)


def _config_table(doc: RunDocument) -> Table:
    base = doc.baseline.config.to_dict()
    rows = [[key, advice.shown(base.get(key)), advice.shown(value) + (" ←" if base.get(key) != value else "")]
            for key, value in doc.config.to_dict().items()]
    return Table("Configuration", ["knob", "baseline", "chosen"], rows,
                 "default: PyTorch's own default (autotune sets nothing); ← changed from the baseline")


def _short(config: Mapping[str, KnobValue] | None) -> str:
    """A stored trial's configuration (``TrialConfig.to_dict``), short; knob by knob where
    this autotune no longer reads it."""
    try:
        return TrialConfig.from_dict(config).short() if config else ""
    except (UsageError, TypeError):
        return ", ".join(f"{k}={advice.shown(v)}" for k, v in config.items()) if config else ""


def _value(t: FrozenTrial) -> float | None:
    """A trial's steady samples/s (its value, but under a planned run: ``advice.steady``);
    for one stopped early, its last measured window."""
    if t.value is not None:
        return advice.steady(t)
    windows = t.intermediate_values
    return float(windows[max(windows)]) if t.state == TrialState.PRUNED and windows else None


def _state(t: FrozenTrial) -> str:
    """How a trial ended, in words."""
    copy = t.user_attrs.get(StudyAttr.DUPLICATE_OF)
    if copy is not None:
        return f"same configuration as #{copy}: not measured again"
    if t.state == TrialState.COMPLETE:
        return "measured"
    if t.state == TrialState.PRUNED:
        return "stopped early: clearly slower"
    if t.state == TrialState.FAIL:
        detail = (t.user_attrs.get(StudyAttr.SKIPPED)
                  or (t.user_attrs.get(StudyAttr.RESULT) or {}).get("message") or "")
        detail = f" ({detail[:160]})" if detail else ""
        return f"failed: {Failure.describe(t.user_attrs.get(StudyAttr.FAILURE))}{detail}"
    return t.state.name.lower()


def _trials_table(study: optuna.Study, *, planned: bool = False) -> Table:
    """Every trial; ``planned``: with the planned run's predicted time, which ranked them."""
    rows = []
    trials = study.get_trials(deepcopy=False)
    for t in trials:
        copy = t.user_attrs.get(StudyAttr.DUPLICATE_OF)
        measured = trials[copy] if copy is not None and 0 <= copy < len(trials) else t
        value = _rate(_value(measured))
        if value and t.state == TrialState.PRUNED:
            value += " (partial)"
        row = [str(t.number), str(t.user_attrs.get(StudyAttr.ROLE) or "sampled"),
               _short(t.user_attrs.get(StudyAttr.CONFIG)), value]
        if planned:
            predicted = (measured.user_attrs.get(StudyAttr.RESULT) or {}).get("planned_s")
            row.append(duration(predicted) if predicted is not None and t.state == TrialState.COMPLETE else "")
        rows.append([*row, _state(t)])
    return Table("Trials of the search",
                 ["#", "role", "configuration", "samples/s", *(["planned run"] if planned else []), "outcome"],
                 rows, "role: why the trial ran (sampled: chosen by Optuna's TPE sampler); samples/s: the median "
                 "measurement window" + ("; planned run: its predicted wall time, one-time costs included, "
                                         "which ranked the trials" if planned else ""))


def _verification_tables(doc: RunDocument) -> list[Table]:
    """Verification's per-round ratios of the emitted configuration over the baseline."""
    speed, alone = doc.side_by_side_rounds, doc.standalone_pairs
    out = []
    if speed is not None:
        rates = speed.samples_per_s
        rows = [[str(i + 1), f"{r:.2f}", _rate(rates[i]) if i < len(rates) else ""]
                for i, r in enumerate(speed.ratios)]
        out.append(Table("Verification, side by side", ["round", "tuned / baseline", "tuned samples/s"], rows,
                         f"median {speed.median or 0:.2f}x, interval {_interval(speed)}: ranks the candidates"))
    if alone is not None:
        tuned, base = alone.samples_per_s, alone.baseline_samples_per_s
        rows = [[str(i + 1), f"{r:.2f}", _rate(tuned[i]) if i < len(tuned) else "",
                 _rate(base[i]) if i < len(base) else ""] for i, r in enumerate(alone.ratios)]
        out.append(Table("Verification, standalone pairs", ["pair", "tuned / baseline", "tuned samples/s",
                                                            "baseline samples/s"], rows,
                         f"median {alone.median or 0:.2f}x, interval {_interval(alone)}: the printed speedup"))
    return out


def _ablation_table(ablation: Ablation) -> Table:
    rows = [[k.knob, advice.shown(k.baseline), advice.shown(k.winner),
             f"{k.effect.ratio:.2f}x" if k.effect is not None else "",
             _interval(k.effect) if k.effect is not None else "",
             "kept" if k.kept else "removed", k.note]
            for k in ablation.knobs]
    return Table("Ablation: the winner over itself with one knob at the baseline's value",
                 ["knob", "baseline", "winner", "ratio", "interval", "", "note"], rows,
                 "above 1.00x the knob helps; one not shown to help and worth under 1.05x is removed")


def _path_table(found: AblationPath, total: Interval, speed: VerifiedSpeedup | None) -> Table:
    rows = [["+ " + ", ".join(step.knobs),
             ", ".join(f"{advice.shown(b)} -> {advice.shown(w)}" for b, w in zip(step.baseline, step.winner)),
             f"{step.effect.ratio:.2f}x", _interval(step.effect), "kept" if step.kept else "removed"]
            for step in found.steps]
    rows.append(["= the winner over the baseline", "", f"{total.ratio:.2f}x", _interval(total), ""])
    note = f"the kept steps multiply to {found.kept_product:.2f}x"
    if speed is not None and speed.side_by_side.low:
        note += f"; the winner's speedup side by side: interval {_interval(speed.side_by_side)}"
    if speed is not None and speed.pairs:
        at_least = (f"{speed.lower_bound:.2f}x or more in {speed.interval.level:.0%} of re-runs, "
                    if speed.lower_bound is not None else "")
        note += (f"; the verified speedup (scripts alone): {at_least}median {speed.interval.ratio:.2f}x, "
                 f"interval {_interval(speed.interval)}")
    return Table("The path from the baseline: each knob added to those before it",
                 ["step", "change", "ratio", "interval", ""], rows, note)


def report_tables(doc: RunDocument, study: optuna.Study | None) -> list[Table]:
    """Every table of the report, in order."""
    tables = [_facts(doc), _config_table(doc)]
    ablation = doc.ablation
    if ablation is not None and ablation.knobs:
        tables.append(_ablation_table(ablation))
    path = ablation.path if ablation is not None else None
    if path is not None and path.steps and path.total is not None:
        tables.append(_path_table(path, path.total, doc.speedup))
    tables += _verification_tables(doc) + [Table(*fields) for fields in utilisation_tables(doc)]
    if doc.step_profile is not None:
        tables.append(Table(profile.TITLE, list(profile.HEADERS), profile.table_rows(doc), profile.table_note(doc)))
    if doc.precision.judged:
        tables.append(quality_check.table(doc.precision.judged))
    if doc.candidates:
        tables.append(Table("Candidates in verification", ["configuration", "side by side", "interval", "outcome"],
                            [[c.config.short(), f"{c.median:.2f}x" if c.median else "",
                              _interval(c), c.outcome] for c in doc.candidates]))
    if study is not None and study.get_trials(deepcopy=False):
        tables.append(_trials_table(study, planned=doc.plan is not None))
    if doc.excluded:
        tables.append(Table("Not searched on this machine", ["knob", "why"],
                            [[k, v] for k, v in doc.excluded.items()]))
    return tables


# --- plots ----------------------------------------------------------------------------

Figure = Any  # matplotlib.figure.Figure: matplotlib is optional, so not imported at module level


def _figure_factory() -> Callable[[float, float], Figure]:
    """The one place matplotlib is imported (raises ImportError without it): figures drawn
    on the Agg canvas directly, so pyplot's global backend, which a notebook calling the
    API may have chosen, is left alone."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    def figure(width: float, height: float) -> Figure:
        fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
        FigureCanvasAgg(fig)
        return fig
    return figure


def write_plots(folder: Path, doc: RunDocument, study: optuna.Study | None) -> list[Plot] | None:
    """Draw the plots the data allows into ``folder`` (old ones of ours removed first);
    None when matplotlib is not installed."""
    try:
        figure = _figure_factory()
    except ImportError:
        return None
    folder.mkdir(parents=True, exist_ok=True)
    for name in PLOT_NAMES:
        (folder / name).unlink(missing_ok=True)
    drawn = [("Search: throughput per trial", "history.png",
              _draw_history(figure, study, doc) if study is not None else None),
             ("Throughput per value of each searched knob", "knobs.png",
              _draw_knobs(figure, study, doc) if study is not None else None),
             ("Ablation: what each knob is worth", "ablation.png", _draw_ablation(figure, doc)),
             ("The path from the baseline, one knob at a time", "path.png", _draw_path(figure, doc)),
             ("Verification: tuned over baseline, per round", "verification.png", _draw_verification(figure, doc)),
             ("Quality check: evaluate() along each training", "quality.png",
              quality_check.draw(figure, doc.precision.judged))]
    plots = []
    for title, name, fig in drawn:
        if fig is None:
            continue
        fig.savefig(folder / name, format="png", metadata={"Software": None})
        plots.append(Plot(title, folder / name))
    return plots


def _draw_history(figure: Callable[[float, float], Figure], study: optuna.Study,
                  doc: RunDocument) -> Figure | None:
    """Each trial's throughput, the best so far, and the baseline's level."""
    trials = study.get_trials(deepcopy=False)
    if not trials:
        return None
    fig = figure(8, 4)
    ax = fig.add_subplot()
    done = [t for t in trials if t.state == TrialState.COMPLETE and t.value is not None]
    pruned = [t for t in trials if t.state == TrialState.PRUNED and _value(t) is not None]
    failed = [t for t in trials if t.state == TrialState.FAIL]
    ax.scatter([t.number for t in done], [advice.steady(t) for t in done], color="tab:blue", zorder=3,
               label="measured")
    ax.scatter([t.number for t in pruned], [_value(t) for t in pruned], facecolors="none", edgecolors="tab:gray",
               zorder=3, label="stopped early (partial)")
    if failed:
        ax.scatter([t.number for t in failed], [0] * len(failed), marker="x", color="tab:red", zorder=3,
                   clip_on=False, label="failed")
    best, steps = 0.0, []
    for t in done:
        best = max(best, advice.steady(t))
        steps.append((t.number, best))
    if steps:
        steps.append((trials[-1].number, best))  # the best stands to the last trial
        ax.step([n for n, _ in steps], [b for _, b in steps], where="post", color="tab:green", label="best so far")
    base, label = next((advice.steady(t) for t in done if t.user_attrs.get(StudyAttr.ROLE) == Role.BASELINE),
                       None), "baseline"
    if base is None:
        base, label = doc.baseline.samples_per_s, "baseline (verification)"
    if base:
        ax.axhline(base, color="tab:orange", linestyle="--", label=label)
    ax.set_xlabel("trial")
    ax.set_ylabel("samples/s")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize="small")
    return fig


def _draw_knobs(figure: Callable[[float, float], Figure], study: optuna.Study,
                doc: RunDocument) -> Figure | None:
    """One small panel per searched knob: each completed trial's throughput at its value of
    the knob, and the median per value."""
    by_value = advice.throughput_by_value(study, doc)
    if not by_value:
        return None
    cols = min(3, len(by_value))
    rows = -(-len(by_value) // cols)
    fig = figure(3.6 * cols, 2.8 * rows)
    for i, (knob, groups) in enumerate(by_value.items()):
        ax = fig.add_subplot(rows, cols, i + 1)
        for x, values in enumerate(groups.values()):
            spread = [x + 0.25 * ((j % 5) - 2) / 2 for j in range(len(values))]  # fixed jitter: no randomness
            ax.scatter(spread, values, s=18, color="tab:blue", alpha=0.7)
            ax.hlines(statistics.median(values), x - 0.3, x + 0.3, color="tab:red", linewidth=2)
        ax.set_xticks(range(len(groups)), [advice.shown(v) for v in groups], fontsize="small")
        ax.set_title(knob, fontsize="medium")
        ax.set_ylim(bottom=0)
        ax.grid(axis="y", alpha=0.3)
    fig.supylabel("samples/s (red: median)")
    return fig


def _draw_ablation(figure: Callable[[float, float], Figure], doc: RunDocument) -> Figure | None:
    """Each knob's ratio as a bar with its interval; kept knobs green, removed ones gray."""
    knobs = [(k, k.effect) for k in (doc.ablation.knobs if doc.ablation is not None else ())
             if k.effect is not None]
    if not knobs:
        return None
    fig = figure(8, 0.6 * len(knobs) + 1.5)
    ax = fig.add_subplot()
    ys = range(len(knobs))
    ratios = [e.ratio for _, e in knobs]
    errors = [[max(0.0, e.ratio - e.low) for _, e in knobs],
              [max(0.0, e.high - e.ratio) for _, e in knobs]]
    colors = ["tab:green" if k.kept else "tab:gray" for k, _ in knobs]
    # bars grow from 1.00 (no effect): right where the knob helps, left where it hurts
    ax.barh(list(ys), [r - 1.0 for r in ratios], left=1.0, xerr=errors, color=colors, capsize=4)
    ax.axvline(1.0, color="black", linewidth=1)
    ax.set_yticks(list(ys), [f"{k.knob} {advice.shown(k.baseline)} -> {advice.shown(k.winner)}"
                             for k, _ in knobs])
    ax.invert_yaxis()
    ax.set_xlabel("winner's speed over the winner with the knob at the baseline's value (gray: removed)")
    ax.grid(axis="x", alpha=0.3)
    return fig


def _draw_path(figure: Callable[[float, float], Figure], doc: RunDocument) -> Figure | None:
    """A waterfall on a log scale: each step's bar runs from the speed before the knob to
    the speed after it (relative to the baseline), so the bars end at the whole."""
    path = doc.ablation.path if doc.ablation is not None else None
    steps = path.steps if path is not None else ()
    if not steps:
        return None
    fig = figure(8, 0.6 * len(steps) + 1.8)
    ax = fig.add_subplot()
    level = 1.0
    for i, step in enumerate(steps):
        ratio = step.effect.ratio
        after = level * ratio
        color = ("tab:green" if ratio >= 1 else "tab:red") if step.kept else "tab:gray"
        ax.barh(i, after - level, left=level, color=color)
        ax.text(max(level, after), i, f" {ratio:.2f}x", va="center")
        level = after
    speed = doc.speedup
    if speed is not None and speed.pairs:
        ax.axvspan(speed.interval.low, speed.interval.high, color="tab:blue", alpha=0.15,
                   label="verified speedup's interval (scripts alone)")
        ax.legend(loc="lower right")
    ax.axvline(1.0, color="black", linewidth=1)
    ax.set_xscale("log")
    ax.set_yticks(range(len(steps)), ["+ " + ", ".join(s.knobs) for s in steps])
    ax.invert_yaxis()
    ax.set_xlabel("speed relative to the baseline (log scale; gray: removed)")
    ax.grid(axis="x", alpha=0.3)
    return fig


def _draw_verification(figure: Callable[[float, float], Figure], doc: RunDocument) -> Figure | None:
    """Side-by-side rounds and standalone pairs, each ratio a point, the median a line, the
    interval shaded (for the pairs: the speedup's printed interval)."""
    speed, alone = doc.side_by_side_rounds, doc.standalone_pairs
    printed = doc.speedup.interval if doc.speedup is not None else None
    # each panel's band: (median, low, high), None where not known
    panels = [(title, unit, part, band) for title, unit, part, band in (
        ("side by side (ranking)", "round", speed,
         (speed.median, speed.ci_low, speed.ci_high) if speed is not None else (None, None, None)),
        ("standalone pairs (printed speedup)", "pair", alone,
         (printed.ratio, printed.low, printed.high) if printed is not None else (None, None, None)))
        if part is not None]
    if not panels:
        return None
    fig = figure(4.5 * len(panels), 3.6)
    for i, (title, unit, part, (median, low, high)) in enumerate(panels):
        ax = fig.add_subplot(1, len(panels), i + 1)
        ratios = list(part.ratios)
        xs = list(range(1, len(ratios) + 1))
        if low is not None and high is not None:
            ax.axhspan(low, high, color="tab:blue", alpha=0.15, label="interval")
        ax.plot(xs, ratios, "o", color="tab:blue", label="tuned / baseline")
        ax.axhline(median if median is not None else statistics.median(ratios), color="tab:blue",
                   label="median")
        ax.axhline(1.0, color="black", linewidth=1)
        ax.set_title(title, fontsize="medium")
        ax.set_xlabel(unit)
        ax.set_xticks(xs)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    return fig

