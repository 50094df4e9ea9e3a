"""report.md and report.html as text, the answer first: the verified speedup (the figure a
re-run stays above, then the median and the interval, as the console summary leads), any
further answer blocks (``ANSWERS``), and the plot of what each knob is worth; then the
tables behind them (the result, the knobs, the advice, the other plots, every table).

A new answer block is one line: a function of the run's document returning an ``Answer``
(or None where the document holds nothing for it), appended to ``ANSWERS``.
"""
from __future__ import annotations

import base64
import dataclasses
import html
from collections.abc import Callable, Sequence
from pathlib import Path

from autotune.document.run import RunDocument
from autotune.report.console import speedup_words

# The ablation's bars: what each knob is worth, which the answer shows beside the speedup.
KNOB_WORTH_PLOT = "ablation.png"


@dataclasses.dataclass
class Table:
    title: str
    headers: list[str]
    rows: list[list[str]]
    note: str = ""


@dataclasses.dataclass
class Plot:
    title: str
    path: Path


@dataclasses.dataclass
class Answer:
    """One block at the top of the report: a heading and its sentences."""

    title: str
    lines: list[str]


def speedup_answer(doc: RunDocument) -> Answer:
    """The verified speedup, as a user can rely on it, or that nothing was faster."""
    speed = doc.speedup
    base = f"{doc.baseline.samples_per_s:,.0f}" if doc.baseline.samples_per_s else "?"
    if speed is None and doc.kept is not None:  # its scripts are in the folder the report is in
        return Answer("No speedup verified", [
            f"No configuration was verified faster than the baseline. {doc.kept.config.short()} was "
            f"{doc.kept.words(None)}.", f"Baseline: {base} samples/s."])
    if speed is None:
        return Answer("No speedup verified", [
            "No configuration was verified faster than the baseline: the baseline is recommended "
            "(the advice below says what became of each candidate).", f"Baseline: {base} samples/s."])
    tuned = doc.best.samples_per_s if doc.best is not None else None
    lines = [f"Verified speedup: {speedup_words(speed)}.",
             f"{tuned:,.0f} samples/s tuned, {base} the baseline, measured as you will run it: {speed.covers}."
             if tuned else f"Baseline: {base} samples/s, measured as you will run it: {speed.covers}."]
    if speed.speed_shift:
        lines.append(f"While verifying, {speed.speed_shift}.")
    return Answer("Speed", lines)


def utilisation_answer(doc: RunDocument) -> Answer | None:
    """How close the baseline and the pick run to the hardware's peak (the table follows
    with the others)."""
    if doc.utilisation is None:
        return None
    return Answer("Utilisation", [line.strip() for line in doc.utilisation.lines()])


# The answer blocks, in order; each returns None where the document holds nothing for it.
ANSWERS: list[Callable[[RunDocument], Answer | None]] = [speedup_answer, utilisation_answer]


def answers(doc: RunDocument) -> list[Answer]:
    return [a for make in ANSWERS if (a := make(doc)) is not None]


def _split_plots(plots: Sequence[Plot]) -> tuple[list[Plot], list[Plot]]:
    """The plot the answer shows, and the others (with the tables)."""
    lead = [p for p in plots if p.path.name == KNOB_WORTH_PLOT]
    return lead, [p for p in plots if p.path.name != KNOB_WORTH_PLOT]


# --- Markdown -------------------------------------------------------------------------


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _md_table(table: Table) -> list[str]:
    out = [f"## {table.title}", ""]
    if table.note:
        out += [table.note, ""]
    out += ["| " + " | ".join(_md_cell(h) for h in table.headers) + " |",
            "|" + "---|" * len(table.headers)]
    out += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in table.rows]
    return [*out, ""]


def _md_line(line: str) -> str:
    return f"  - {line.strip()}" if line.startswith("  ") else f"- {line}"


def render_markdown(doc: RunDocument, lines: list[str], tables: list[Table], plots: list[Plot],
                    notes: list[str], *, base: Path, blocks: Sequence[Answer] = ()) -> str:
    """The report as Markdown; plots linked relative to ``base`` (the output folder);
    ``blocks``: the answer's blocks (``answers(doc)``), which lead."""
    lead, rest = _split_plots(plots)
    out = [f"# autotune report: {Path(doc.model_file).name}", ""]
    out += [f"> {note}" for note in notes] + ([""] if notes else [])
    out += ["## The answer", ""]
    for i, block in enumerate(blocks):
        out += [f"### {block.title}", ""]
        out += [f"**{line}**" if i == 0 and j == 0 else line for j, line in enumerate(block.lines)]
        out.append("")
    out += [f"![{p.title}]({p.path.relative_to(base).as_posix()})\n" for p in lead]
    out += _md_table(tables[0]) + _md_table(tables[1])
    out += ["## Advice", "", *(_md_line(line) for line in lines), ""]
    if rest:
        out += ["## Plots", ""]
        out += [f"![{p.title}]({p.path.relative_to(base).as_posix()})\n" for p in rest]
    for table in tables[2:]:
        out += _md_table(table)
    return "\n".join(out)


# --- HTML -----------------------------------------------------------------------------

_CSS = """
body { font-family: sans-serif; max-width: 1100px; margin: 2em auto; padding: 0 1em; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.15em; margin-top: 1.6em; border-bottom: 1px solid #ddd; }
h3 { font-size: 1em; margin-bottom: 0.2em; } .answer { font-size: 1.1em; } .lead { font-weight: bold; }
table { border-collapse: collapse; font-size: 0.9em; margin: 0.5em 0; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: left; vertical-align: top; }
th { background: #f0f0f0; } tr:nth-child(even) td { background: #fafafa; }
.note { color: #555; font-size: 0.9em; } .warn { background: #fff6d6; padding: 0.5em; }
li.sub { margin-left: 1.5em; list-style: circle; } img { max-width: 100%; display: block; margin: 0.5em 0; }
"""


def _html_table(table: Table) -> str:
    e = html.escape
    head = "".join(f"<th>{e(h)}</th>" for h in table.headers)
    body = "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>" for row in table.rows)
    note = f'<p class="note">{e(table.note)}</p>' if table.note else ""
    return f"<h2>{e(table.title)}</h2>{note}<table><tr>{head}</tr>{body}</table>"


def _html_plot(p: Plot) -> str:
    e = html.escape
    data = base64.b64encode(p.path.read_bytes()).decode("ascii")
    return (f'<figure><img alt="{e(p.title)}" src="data:image/png;base64,{data}">'
            f"<figcaption>{e(p.title)}</figcaption></figure>")


def render_html(doc: RunDocument, lines: list[str], tables: list[Table], plots: list[Plot],
                notes: list[str], *, blocks: Sequence[Answer] = ()) -> str:
    """The report as one self-contained HTML page: plots inlined as data URIs, inline CSS,
    no reference to anything outside the file; ``blocks`` lead, as in render_markdown."""
    e = html.escape
    lead, rest = _split_plots(plots)
    title = f"autotune report: {Path(doc.model_file).name}"
    parts = [f"<h1>{e(title)}</h1>", *(f'<p class="warn">{e(n)}</p>' for n in notes),
             '<section class="answer"><h2>The answer</h2>']
    for i, block in enumerate(blocks):
        parts.append(f"<h3>{e(block.title)}</h3>")
        parts += [f'<p class="lead">{e(line)}</p>' if i == 0 and j == 0 else f"<p>{e(line)}</p>"
                  for j, line in enumerate(block.lines)]
    parts += [_html_plot(p) for p in lead]
    parts += ["</section>", _html_table(tables[0]), _html_table(tables[1]), "<h2>Advice</h2><ul>"]
    parts += [f'<li class="sub">{e(line.strip())}</li>' if line.startswith("  ") else f"<li>{e(line)}</li>"
              for line in lines]
    parts.append("</ul>")
    if rest:
        parts.append("<h2>Plots</h2>")
    parts += [_html_plot(p) for p in rest]
    parts += [_html_table(t) for t in tables[2:]]
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{e(title)}</title>'
            f"<style>{_CSS}</style></head><body>\n" + "\n".join(parts) + "\n</body></html>\n")
