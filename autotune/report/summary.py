"""The answer at the end of a run, in one screen: the lines a user reads first.

It opens with what they act on: the verdict and its figure, what to change (only the knobs
that changed, each with what it is worth where the ablation measured it), the command to
train with and where the report is; then, briefly, what the run could not do. Everything else
(the unchanged knobs, what the interval covers, utilisation, the precision and batch
evidence, the steering rounds, the full list of knobs not searched) is in ``autotune show
OUTDIR --details``, report.md/html and best_config.json. Each line fits ``WIDTH`` columns,
and the whole fits ``MOST_LINES`` (a terminal's screen, less the prompt's lines). A path is
never cut: its length is the user's (``--out``).
"""
from __future__ import annotations

import os
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from autotune.document.paths import resolve
from autotune.document.run import RunDocument

WIDTH = 100
MOST_LINES = 20
RELIED_ON = "verified"  # the verdict's first word where a speedup was verified
CHANGE_LINES = 3  # the changed knobs' lines at most: with the verdict, the command and the report, 6
REJECTIONS_SHOWN = 3
EDITS_SHOWN = 3  # a script's lines to change, one a line
EXPLAINED = "docs/outputs.md"  # what the words of the answer mean, at length


def shown_path(path: Path) -> str:
    """``path`` as the user can type it from where they ran autotune: relative below the
    current folder, else as it is."""
    try:
        relative = os.path.relpath(path)
    except ValueError:  # another drive
        return str(path)
    return relative if not relative.startswith("..") else str(path)


def fit(text: str, width: int = WIDTH) -> str:
    """One line of at most ``width`` columns (a reason's lines run together): cut, with an
    ellipsis, where longer."""
    text = " ".join(text.split())
    return text if len(text) <= width else text[:width - 1] + "…"


def packed(head: str, items: Sequence[str]) -> list[str]:
    """``items`` after ``head``, comma-separated, each kept whole on one line of ``WIDTH``
    where it fits one (the next lines indented)."""
    lines = [head]
    for i, item in enumerate(items):
        piece = item + ("," if i < len(items) - 1 else "")
        fresh = lines[-1] in (head, "  ")
        if not fresh and len(lines[-1]) + 1 + len(piece) > WIDTH:
            lines.append("  ")
            fresh = True
        lines[-1] += piece if fresh else " " + piece
    return lines


def wrapped(head: str, items: Sequence[str], *, most: int, more: str) -> list[str]:
    """``items`` after ``head`` (``packed``) over at most ``most`` lines; where they do not
    fit, as many as do, and how many were left out and ``more``."""
    for kept in range(len(items), 0, -1):
        tail = [] if kept == len(items) else [f"and {len(items) - kept} more ({more})"]
        lines = packed(head, [*items[:kept], *tail])
        if len(lines) <= most:
            return lines
    return [fit(head + items[0])]


def _value(value: Any) -> str:
    return "default" if value is None else str(value)


def changes(doc: RunDocument) -> list[str]:
    """Each knob the answer changes from the user's configuration, from -> to, with its worth
    to the winner where the ablation measured it (above 1.00x: it helps)."""
    worth: Mapping[str, str] = {}
    if doc.ablation is not None:
        worth = {k.knob: f" ({k.effect.ratio:.2f}x)" for k in doc.ablation.knobs if k.effect is not None and k.kept}
    base, cfg = doc.baseline.config, doc.config
    said = []
    if base.layout != cfg.layout:  # ranks x threads: one knob, as the search and the ablation take it
        said.append(f"layout {base.layout} → {cfg.layout}{worth.get('layout', '')}")
    before = base.to_dict()
    for key, value in cfg.to_dict().items():
        if key in ("nprocs", "threads") or (key in ("lr_scaling", "lr_batch") and cfg.lr_factor == 1.0):
            continue
        if before.get(key) != value:
            said.append(f"{key} {_value(before.get(key))} → {_value(value)}{worth.get(key, '')}")
    return said


def verdict(doc: RunDocument) -> list[str]:
    """The first line: verified with the figure a re-run stays above and the median, or not."""
    speed = doc.speedup
    if speed is not None:
        iv = speed.interval
        if speed.lower_bound is None:  # a document from before the figure a re-run stays above
            return [fit(f"{RELIED_ON}: {iv.ratio:.2f}x faster (the median; a re-run lands in {iv.low:.2f}-"
                        f"{iv.high:.2f}x, {iv.level:.0%}; {speed.pairs} standalone pairs)")]
        return [fit(f"{RELIED_ON}: {speed.lower_bound:.2f}x faster or more (median {iv.ratio:.2f}x; "
                    f"{iv.level:.0%} of re-runs within {iv.low:.2f}-{iv.high:.2f}x, {speed.pairs} standalone pairs)")]
    if doc.kept is not None:  # named after the command: its configuration is long
        iv = doc.kept.interval
        return [fit(f"not verified: keep yours; the fastest ran {iv.ratio:.2f}x faster by its median "
                    f"({doc.kept.pairs} pairs), a re-run {iv.low:.2f}-{iv.high:.2f}x")]
    return ["not verified: nothing ran faster than your configuration by a margin a re-run keeps: keep it"]


def own_terms(doc: RunDocument, folder: Path) -> list[str]:
    """A script's answer in its own terms: its flags, its lines, its patch, its ranks."""
    script = doc.script
    if script is None or not doc.verified:
        return []
    lines = []
    flags = list(script.flags) if script.parsed and script.flags else []
    if flags:
        lines.append(f"on your script's command line: {shlex.join(flags)}")  # to copy: never cut nor wrapped
    edits = [line for line in script.lines if line != " ".join(flags)]
    lines += [fit(f"in your script: {line}") for line in edits[:EDITS_SHOWN]]
    if len(edits) > EDITS_SHOWN:
        lines.append(f"  and {len(edits) - EDITS_SHOWN} more: autotune show {shown_path(folder)} --details")
    if "patch" in (doc.outputs or {}):
        patch = shown_path(resolve(doc, folder, "patch"))
        lines.append(f"as a patch of your script: patch -p1 < {patch}")  # a path is never cut
    if doc.config.nprocs > 1:
        cfg = doc.config
        lines.append(fit(f"as {cfg.nprocs} ranks (launch.sh starts them): a per-device batch of {cfg.micro_batch}, "
                         f"the global batch {cfg.batch_size}"))
    return lines


def could_not(doc: RunDocument) -> list[str]:
    """Briefly, what the run could not do: the knobs it did not search, counted, and each
    rejection in a line."""
    lines = []
    if doc.excluded:
        # each as excluded, a value with its knob: "precision=fp16", never "precision" where
        # bf16 was searched (and may be what the answer changed)
        lines.append(fit(f"not searched here: {len(doc.excluded)} knobs and values ({', '.join(doc.excluded)})"))
    for label, reason in doc.precision.rejected.items():
        lines.append(fit(f"precision: {label} rejected: {reason}"))
    for item in doc.rejected[:REJECTIONS_SHOWN]:
        lines.append(fit(f"rejected {item.config.short()}: {item.reason}"))
    if len(doc.rejected) > REJECTIONS_SHOWN:
        lines.append(f"  and {len(doc.rejected) - REJECTIONS_SHOWN} more rejected")
    if doc.speedup is not None and doc.speedup.unsteady:
        lines.append(fit(f"warning: {doc.speedup.unsteady}"))
    return lines


def answer(doc: RunDocument, folder: Path) -> list[str]:
    """The summary's lines, at most ``MOST_LINES`` of at most ``WIDTH`` columns."""
    where = shown_path(folder)
    said = changes(doc) if doc.verified else []
    lines = verdict(doc)
    lines += (wrapped("change: ", said, most=CHANGE_LINES, more=f"autotune show {where} --details")
              if said else ["change: nothing: your configuration stays as it is"])
    launcher = shown_path(resolve(doc, folder, "launcher"))
    lines.append(f"train with: {launcher}")
    report = folder / "report.html"
    lines.append(f"report: {shown_path(report) if report.exists() else where + '/best_config.json'}")
    lines += own_terms(doc, folder)
    if doc.kept is not None and not doc.verified:
        lines.append(fit(f"not emitted: {doc.kept.config.short()}"))
        lines.append(f"  `autotune verify {where}` measures it again")
    if doc.config.lr_factor != 1.0:
        lines.append(fit(f"learning rate: x{doc.config.lr_factor:g} (--scale-lr {doc.config.lr_scaling}), "
                         "applied by train_tuned.py; your own launcher must apply it"))
    brief = could_not(doc)
    if brief:
        lines += ["", *brief]
    lines += ["", f"everything else: autotune show {where} --details; the words explained: {EXPLAINED}"]
    if len(lines) > MOST_LINES:  # the brief part gives way, never the answer
        lines = [*lines[:MOST_LINES - 2], "  …", lines[-1]]
    return lines
