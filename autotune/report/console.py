"""What the user sees: progress while tuning, and the summary at the end.

Progress goes to stderr (so ``--json`` keeps stdout clean); a silent terminal for
minutes looks hung, so every trial and every measurement window prints a line.
Text that comes from the user (paths, exception messages, log lines, environment
values) is printed as text, never as rich markup: "[/data/train]" in an error message
must not end the run.
"""
from __future__ import annotations

import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table
from rich.text import Text

from autotune.config import TrialConfig
from autotune.document.measures import VerifiedSpeedup
from autotune.document.paths import resolve
from autotune.document.run import RunDocument
from autotune.report.advice import ablation_lines, plan_lines
from autotune.runtime.knobs import Precision
from autotune.task.objective import duration
from autotune.trials.progress import (
    BudgetStop,
    ProgressInfo,
    SpeedRound,
    StaleTrial,
    TrialEnd,
    TrialStart,
    TrialWindow,
    VerifyStep,
)
from autotune.trials.protocol import ProgressEvent, Role, Status
from autotune.trials.runner import TrialResult


class Reporter:
    """Progress on stderr, one line per event; the result on stdout. At a terminal a live
    bar below the lines shows the trial count, elapsed and estimated time. Lines are never
    wrapped (a CI log keeps one event per line). ``quiet`` prints nothing on stderr;
    ``verbose`` adds every measurement window."""

    def __init__(self, *, quiet: bool = False, verbose: bool = False) -> None:
        self.err = Console(stderr=True, highlight=False, quiet=quiet, soft_wrap=True)
        self.out = Console(highlight=False, soft_wrap=True)
        self.verbose = verbose
        self.baseline: float | None = None
        self._bar: Progress | None = None
        self._task: TaskID | None = None
        self._now = ""  # the configuration measured now, as the bar shows it
        self._best: float | None = None

    def info(self, text: str) -> None:
        self.err.print(text, markup=False)

    def warn(self, text: str) -> None:
        self.err.print(Text.assemble(("warning:", "yellow"), " ", text))

    def search(self, kind: ProgressEvent, info: ProgressInfo) -> None:
        if isinstance(info, TrialStart):
            self._advance(number=info.number, of=info.of, config=info.config)
            role = f" ({info.role})" if info.role else ""
            self.err.print(
                f"[bold]trial {info.number}/{info.of}[/]{role}  {escape(info.config.short())}"
                f"  [dim]{info.elapsed:.0f} s elapsed[/]"
            )
        elif isinstance(info, TrialWindow):
            self._show_window(info.value)
            if self.verbose:
                self.err.print(f"    window {info.i + 1}: {info.value:,.0f} samples/s", style="dim")
        elif isinstance(info, TrialEnd):
            if info.role == Role.BASELINE and info.result.value:
                self.baseline = info.result.value
            if "best_planned_s" not in info.planned:  # a planned run's best is an effective rate, not a window's
                self._best = info.best or self._best
            self.trial_end(info.result, info.best, planned=info.planned)
        elif isinstance(info, StaleTrial):
            self.warn(f"trial {info.number} was left running by an interrupted run; "
                      "marked failed, measuring it again")
        elif isinstance(info, BudgetStop):
            self.err.print(f"search stopped: {info.reason}")

    def _advance(self, *, number: int, of: int, config: TrialConfig) -> None:
        """The live bar: trial k of N, elapsed, time left; at a terminal only."""
        if not self.err.is_terminal or self.err.quiet:
            return
        if self._bar is None:
            self._bar = Progress(TextColumn("search"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), TimeRemainingColumn(),
                                 TextColumn("{task.fields[now]}", markup=False), console=self.err,
                                 transient=True)
            self._bar.start()
            self._task = self._bar.add_task("search", total=of, now="")
        assert self._task is not None
        self._now = config.short()
        self._bar.update(self._task, completed=number - 1, total=of, now=self._now)

    def _show_window(self, value: float) -> None:
        """Beside the bar: the configuration measured now, its last window against the
        baseline and the best so far."""
        if self._bar is None or self._task is None:
            return
        against = [f"{value:,.0f} samples/s"]
        if self.baseline:
            against.append(f"{value / self.baseline:.2f}x the baseline")
        if self._best:
            against.append(f"{value / self._best:.2f}x the best")
        self._bar.update(self._task, now=f"{self._now}: {', '.join(against)}")

    def end_search(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None

    def trial_end(self, result: TrialResult, best: float | None,
                  planned: Mapping[str, float | None] | None = None) -> None:
        """``planned``: under a planned run, its predicted time for this trial
        (``planned_s``, ``one_time_s``) and the best so far (``best_planned_s``)."""
        against = []
        if self.baseline and result.value:
            against.append(f"{result.value / self.baseline:.2f}x the baseline")
        shown = planned or {}
        planned_s, best_planned_s = shown.get("planned_s"), shown.get("best_planned_s")
        if planned_s is not None:
            against.append(f"planned run {duration(planned_s)}, "
                           f"{duration(shown.get('one_time_s') or 0.0)} of it one-time")
        if best_planned_s:
            against.append(f"best so far {duration(best_planned_s)}")
        elif best and "best_planned_s" not in shown:
            against.append(f"best so far {best:,.0f}")
        tail = f"  ({', '.join(against)})" if against else ""
        if result.status == Status.OK:
            self.err.print(f"    → {result.value:,.0f} samples/s (IQR {result.iqr or 0:,.0f}){tail}")
        elif result.status == Status.PRUNED:
            self.err.print(f"    → pruned: clearly slower than the best{tail}")
        else:
            self.err.print(f"    → [red]failed[/] ({escape(str(result.failure))}): "
                           f"{escape(result.describe_failure())}")
            for line in result.log_tail.strip().splitlines()[-12:]:
                self.err.print(f"      | {line}", style="dim", markup=False)

    def verify(self, kind: ProgressEvent, info: ProgressInfo) -> None:
        self.end_search()
        if isinstance(info, SpeedRound):
            self.err.print(f"verify speed: round {info.round}/{info.rounds}", style="dim")
        else:
            self.err.print(f"verify: {info.text if isinstance(info, VerifyStep) else kind}", markup=False)

    def summary(self, doc: RunDocument, folder: Path) -> None:
        base = doc.baseline
        table = Table(title=Text(f"autotune: {doc.model_file}"), show_header=True)
        table.add_column("knob")
        table.add_column("baseline")
        table.add_column("chosen")
        before_all = base.config.to_dict()
        for key, value in doc.config.to_dict().items():
            if key in ("lr_scaling", "lr_batch") and doc.config.lr_factor == 1.0:
                continue  # not a knob: the line below the table says where it scaled the rate
            before = before_all.get(key)
            mark = "" if before == value else " ←"
            table.add_row(key, Text(_shown(before)), Text(f"{_shown(value)}{mark}"))
        self.out.print(table)
        if doc.config.lr_factor != 1.0:
            self.out.print(f"learning rate: x{doc.config.lr_factor:g} (--scale-lr {doc.config.lr_scaling}: the "
                           f"batch {doc.config.batch_size} over your {doc.config.lr_batch}), applied by "
                           "train_tuned.py; your own launcher must apply it (see its file)", markup=False)
        self.out.print(f"baseline: {base.samples_per_s:,.1f} samples/s")
        speed = doc.speedup
        if speed is not None:
            best = doc.best.samples_per_s if doc.best is not None else 0.0
            self.out.print(f"[bold green]verified:[/] {best:,.1f} samples/s, speedup {speedup_words(speed)}")
            self.out.print(f"  measured as you will run it: {speed.covers}; "
                           f"{speed.wall_s:.0f} s of verification", markup=False)
            if speed.speed_shift:
                self.out.print(f"  while verifying, {speed.speed_shift}", markup=False)
            if speed.unsteady:
                self.warn(speed.unsteady)
        elif doc.kept is not None:
            self.out.print("[bold red]no configuration was verified faster than the baseline.[/]")
            self.out.print(f"{doc.kept.config.short()} was {doc.kept.words(str(folder))}", markup=False)
        else:
            self.out.print("[bold red]no configuration was verified faster than the baseline;[/] "
                           "the baseline is recommended.")
        for line in doc.utilisation.lines() if doc.utilisation is not None else []:
            self.out.print(line, markup=False)
        # the stages that stopped once they knew, or that --timeout shortened
        for line in doc.stages.lines() if doc.stages is not None else []:
            self.out.print(f"  {line}", markup=False)
        precision = doc.precision
        if precision.checked:
            self.out.print(f"precision: {precision.checked}", markup=False)
        for label, reason in precision.rejected.items():
            self.out.print(f"precision: {label} rejected ({reason}); "
                           f"{precision.instead} is emitted instead", markup=False)
        for label, reason in precision.inconclusive.items():
            self.out.print(f"precision: {label} inconclusive ({reason}); "
                           f"{precision.instead} is emitted instead", markup=False)
        if precision.opt_out and doc.config.precision != Precision.FP32:
            self.out.print(f"  to opt out: {precision.opt_out}", markup=False)
        layout = doc.layout_effect
        if layout is not None:
            e = layout.effect
            self.out.print(
                f"process layout: {layout.multi_rank} ranks x threads runs "
                f"{e.ratio:.2f}x the speed of {layout.single_process} "
                f"({e.level:.0%} interval {e.low:.2f}-{e.high:.2f}x, "
                "other knobs equal, measured side by side)"
            )
        for line in (ablation_lines(doc) + plan_lines(doc) + (doc.memory.lines() if doc.memory else [])
                     + (doc.batch.lines() if doc.batch else []) + (doc.steering.lines() if doc.steering else [])):
            self.out.print(line, markup=False)
        for item in doc.rejected:
            self.out.print(f"  rejected {item.config.short()}: {item.reason}", markup=False)
        if doc.excluded:
            self.out.print("not searched on this machine:")
            for knob, reason in doc.excluded.items():
                self.out.print(f"  {knob}: {reason}", markup=False)
        # best_config.json, train_tuned.py and launch.sh first, then the same configuration
        # for accelerate, Lightning, torchrun and the user's own loop
        keys = ["config", "script", "launcher"]
        keys += [k for k in doc.outputs or {} if k not in keys]
        self.out.print(f"wrote {', '.join(str(resolve(doc, folder, k)) for k in keys)}", markup=False)
        if doc.script is not None:  # the answer in the script's own terms
            script = doc.script
            if not script.arguments:
                self.out.print(f"your script's {script.stack} are already the fastest verified ones", markup=False)
            changes = list(script.lines)
            if script.parsed and script.flags:
                self.out.print(f"add to your script's command line: {shlex.join(script.flags)}", markup=False)
                changes = [line for line in changes if line != " ".join(script.flags)]
            for line in changes:
                self.out.print(f"change in your script: {line}", markup=False)
            if doc.config.nprocs > 1:
                cfg = doc.config
                self.out.print(f"run it as {cfg.nprocs} ranks (launch.sh does; or torchrun --nproc-per-node "
                               f"{cfg.nprocs}): a per-device batch of {cfg.micro_batch}, the global batch "
                               f"{cfg.batch_size}", markup=False)
            if "patch" in (doc.outputs or {}):
                patch = resolve(doc, folder, "patch")
                self.out.print(f"the same as a patch: {patch}  (in your script's folder: patch -p1 < {patch})",
                               markup=False)
        self.out.print(f"train with: {resolve(doc, folder, 'launcher')}  # {(doc.launch or '').partition('# ')[2]}",
                       markup=False)
        report = folder / "report.html"
        if report.exists():
            self.out.print(f"report: {report} (and report.md; `autotune show` repeats this)",
                           markup=False)


def speedup_words(speed: VerifiedSpeedup) -> str:
    """The verified speedup, what a user can rely on first: the figure a re-run stays above
    (documents from before it had none: the median and the interval)."""
    iv = speed.interval
    if speed.lower_bound is None:
        return (f"{iv.ratio:.2f}x over {speed.pairs} pairs of standalone runs "
                f"(a re-run lands in {iv.low:.2f}-{iv.high:.2f}x, {iv.level:.0%})")
    return (f"{speed.lower_bound:.2f}x or more in {iv.level:.0%} of re-runs (median {iv.ratio:.2f}x, "
            f"{iv.level:.0%} of re-runs within {iv.low:.2f}-{iv.high:.2f}x; "
            f"{speed.pairs} pairs of standalone runs)")


def _shown(value: Any) -> str:
    """A knob's value as the user reads it: PyTorch's own default where autotune sets none."""
    return "default" if value is None else str(value)
