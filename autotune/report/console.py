"""What the user sees: progress while tuning, and the answer at the end.

Progress goes to stderr (so ``--json`` keeps stdout clean). On a terminal it is one live
panel (``report.live``): the stage, the step, the best so far, the time spent and left. Where
stderr is not a terminal (a pipe, a CI log), or with ``--json`` or ``--quiet``, it is a line
per event, as a log reads; a silent log for minutes looks hung, so every trial and every
measurement window prints one. The answer at the end is one screen (``report.summary``);
``autotune show OUTDIR --details`` prints everything (``Reporter.details``).
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
from rich.table import Table
from rich.text import Text

from autotune.document.measures import VerifiedSpeedup
from autotune.document.paths import resolve
from autotune.document.run import RunDocument
from autotune.report.advice import ablation_lines, plan_lines
from autotune.report.live import LiveView
from autotune.report.summary import answer
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
    """Progress on stderr; the answer on stdout. ``live`` (default: where stderr is a
    terminal) shows one live panel in place of the per-event lines; else lines are never
    wrapped (a CI log keeps one event per line). ``quiet`` prints nothing on stderr;
    ``verbose`` adds every measurement window to the lines."""

    def __init__(self, *, quiet: bool = False, verbose: bool = False, live: bool | None = None) -> None:
        self.err = Console(stderr=True, highlight=False, quiet=quiet, soft_wrap=True)
        self.out = Console(highlight=False, soft_wrap=True)
        self.verbose = verbose
        self.baseline: float | None = None
        self._best: float | None = None
        self._live_wanted = (self.err.is_terminal if live is None else live) and not quiet
        self._view: LiveView | None = None
        self._started_at: float | None = None
        self._ends_at: float | None = None

    @property
    def view(self) -> LiveView | None:
        """The live panel, started on first use where it is wanted."""
        if self._view is None and self._live_wanted:
            self._view = LiveView(self.err)
            if self._started_at is not None:
                self._view.started = self._started_at
            self._view.ends_at = self._ends_at
        return self._view

    def close(self) -> None:
        """The live panel gone (it leaves nothing on the screen); lines from here on."""
        if self._view is not None:
            self._view.stop()
            self._view = None
        self._live_wanted = False

    def clock(self, *, started_at: float, timeout_s: float | None) -> None:
        """When the run began, and its --timeout: the panel's elapsed time and its bound."""
        self._started_at = started_at
        self._ends_at = None if timeout_s is None else started_at + timeout_s
        if self._view is not None:
            self._view.started, self._view.ends_at = started_at, self._ends_at

    def stage(self, name: str, *, estimate_s: Mapping[str, float] | None = None) -> None:
        """A stage of the run begins (the check, the probe, the batch range, verification,
        the profile); verification's with its stages' estimate, in seconds by stage."""
        view = self.view
        if view is None:
            return
        if estimate_s is not None:
            view.verification(estimate_s)
        else:
            view.enter(name)

    def info(self, text: str) -> None:
        if self.view is not None:
            self.view.latest = text.strip()
            return
        self.err.print(text, markup=False)

    def skipping(self, knob: str, reason: str) -> None:
        """A knob the search leaves out on this machine: a line in a log; on a terminal the
        answer counts them, and `autotune show --details` names them."""
        if self.view is None:
            self.err.print(f"  skipping {knob}: {reason}", markup=False)

    def warn(self, text: str) -> None:
        self.err.print(Text.assemble(("warning:", "yellow"), " ", text))  # above the panel, where there is one

    def search(self, kind: ProgressEvent, info: ProgressInfo) -> None:
        if isinstance(info, TrialEnd):
            if info.role == Role.BASELINE and info.result.value:
                self.baseline = info.result.value
            if "best_planned_s" not in info.planned:  # a planned run's best is an effective rate, not a window's
                self._best = info.best or self._best
        view = self.view
        if view is not None:
            self._show(view, info)
            return
        if isinstance(info, TrialStart):
            role = f" ({info.role})" if info.role else ""
            self.err.print(
                f"[bold]trial {info.number}/{info.of}[/]{role}  {escape(info.config.short())}"
                f"  [dim]{info.elapsed:.0f} s elapsed[/]"
            )
        elif isinstance(info, TrialWindow):
            if self.verbose:
                self.err.print(f"    window {info.i + 1}: {info.value:,.0f} samples/s", style="dim")
        elif isinstance(info, TrialEnd):
            self.trial_end(info.result, info.best, planned=info.planned)
        elif isinstance(info, StaleTrial):
            self.warn(f"trial {info.number} was left running by an interrupted run; "
                      "marked failed, measuring it again")
        elif isinstance(info, BudgetStop):
            self.err.print(f"search stopped: {info.reason}")

    def _show(self, view: LiveView, info: ProgressInfo) -> None:
        """A search event on the live panel."""
        if isinstance(info, TrialStart):
            view.trial(info.number, info.of, info.config.short())
        elif isinstance(info, TrialWindow):
            against = [f"{info.value:,.0f} samples/s"]
            if self.baseline:
                against.append(f"{info.value / self.baseline:.2f}x the baseline")
            view.latest = f"last window: {', '.join(against)}"
        elif isinstance(info, TrialEnd):
            if info.result.status not in (Status.OK, Status.PRUNED):
                view.failed += 1
                view.latest = f"a trial failed ({info.result.failure}): {info.result.describe_failure()}"
            if self._best and self.baseline:
                view.best = f"best so far {self._best / self.baseline:.2f}x the baseline ({self._best:,.0f} samples/s)"
        elif isinstance(info, StaleTrial):
            self.warn(f"trial {info.number} was left running by an interrupted run; "
                      "marked failed, measuring it again")
        elif isinstance(info, BudgetStop):
            view.latest = f"search stopped: {info.reason}"

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
        view = self.view
        if view is not None:
            if isinstance(info, SpeedRound):
                view.speed_round(info.round, info.rounds)
            elif isinstance(info, VerifyStep):
                if info.stage is not None:
                    step = f"pair {info.step} of at most {info.of}" if info.step is not None else ""
                    view.verify_stage(info.stage, step=step)
                view.latest = info.text
            return
        if isinstance(info, SpeedRound):
            self.err.print(f"verify speed: round {info.round}/{info.rounds}", style="dim")
        else:
            self.err.print(f"verify: {info.text if isinstance(info, VerifyStep) else kind}", markup=False)

    def summary(self, doc: RunDocument, folder: Path) -> None:
        """The answer, in one screen (``report.summary``)."""
        self.close()
        for line in answer(doc, folder):
            self.out.print(line, markup=False)

    def details(self, doc: RunDocument, folder: Path) -> None:
        """Everything the run found, as `autotune show OUTDIR --details` prints it."""
        self.close()
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
