"""One tuning run: probe -> space -> search -> verify -> emit -> report.

``tune`` takes the output folder and the machine-wide measurement lock and runs the stages;
``execute`` runs them with the machine description and the trial runner as arguments, so
that the whole pipeline can be driven on recorded probes of other machines by a stand-in
runner (tests/test_machine_matrix.py). Each stage is a function of its own folder that takes
its sections of the options whole (``autotune.sections``): this module keeps their order.
"""
from __future__ import annotations

import contextlib
import functools
import os
import time
from collections.abc import Callable
from pathlib import Path

from autotune import outdir
from autotune.document.run import RunDocument
from autotune.emit.assemble import build_document
from autotune.emit.outputs import candidate_emitter
from autotune.emit.write import emit_outputs
from autotune.harness import make_runner, waiting_notice
from autotune.options import RunOptions
from autotune.probes import MachineLike, as_machine, probe_machine
from autotune.report.console import Reporter
from autotune.report.files import write_report
from autotune.runtime.json_value import JsonObject
from autotune.runtime.knobs import Device
from autotune.search import shared
from autotune.search.stage import Searched, run_search
from autotune.search.task_space import build_task_space
from autotune.sections import Sections, sections
from autotune.task import Task, load_task
from autotune.task.way_in import PrintedMetric
from autotune.trials import forkserver, launch, measure_lock, proctree
from autotune.trials.runner import TrialRunnerLike
from autotune.verify.reserve import leave_for_verification
from autotune.verify.stage import run_verification
from autotune.workbench import Workbench

EXIT_VERIFIED = 0
EXIT_NOT_VERIFIED = 3


def output_folder(model_file: Path, out: Path | None) -> Path:
    """Where a run writes: ``out``, else ``autotune-out/<model name>``; absolute, since
    trials and scripts run with other working directories."""
    return (out or Path("autotune-out") / model_file.stem).absolute()


def tune(model_file: Path, *, out: Path | None, options: RunOptions, reporter: Reporter,
         force: bool = False, script_args: tuple[str, ...] = ()) -> RunDocument:
    """The run as the CLI starts it: the output folder held exclusively, the model file (or
    the Trainer script, run with ``script_args``) checked before anything is created, one
    measuring autotune per machine."""
    started = time.time()  # --timeout counts from here
    out = output_folder(model_file, out)
    # Subreaper first: processes the model file starts during its check are ours to end.
    proctree.become_subreaper()
    try:
        with contextlib.ExitStack() as stack:
            outdir.check_ours(out, force=force)
            if out.is_dir():  # a busy folder is refused before the model file is even checked
                stack.enter_context(outdir.exclusive(out))
            reporter.clock(started_at=started, timeout_s=options.timeout_s)
            reporter.stage(f"checking {model_file.name}")
            # before creating anything: bad input loses nothing; the model where trials put it
            task = load_task(model_file, device=Device.CPU if options.fixed.get("device") == Device.CPU else None,
                             script_args=script_args, metric=printed_metric(options))
            # the check's warm interpreter, ended on the way out where make_runner has not taken it over
            checked = forkserver.shared()
            stack.callback(checked.close)
            if task.script is not None:
                reporter.info(f"{model_file}: {task.script.describe()}")
            parts = sections(options, task=task)  # --epochs of a data set without a length: refused here
            proctree.reap_orphans(spare=checked.pids())
            if not out.is_dir():
                stack.enter_context(outdir.exclusive(outdir.prepare(out)))
            if not parts.sharing.shared:
                stack.enter_context(measure_lock.held(notice=waiting_notice(reporter.warn)))
            # else the workers of a shared study on this machine take turns per trial
            reporter.stage("probing the machine")
            machine = probe_machine()
            runner = make_runner(task, machine, out, parts.measure)
            stack.callback(runner.shutdown)
            workbench = Workbench(task=task, machine=machine, runner=runner, out=out, reporter=reporter)
            return run(workbench, parts, started_at=started)
    finally:
        proctree.reap_orphans()


def printed_metric(options: RunOptions) -> PrintedMetric | None:
    """The metric a plain loop prints, as --metric and --metric-lower-is-better name it."""
    if options.metric is None:
        return None
    return PrintedMetric(options.metric, greater_is_better=not options.metric_lower_is_better)


def execute(task: Task, out: Path, options: RunOptions, *, machine: MachineLike,
            runner: TrialRunnerLike, reporter: Reporter, started_at: float | None = None) -> RunDocument:
    """Search, verify and emit for ``task`` on ``machine`` (or a recorded probe document of
    it), measuring with ``runner``; returns the result document as written to ``out``.
    ``started_at``: when the run began (epoch seconds; default now), what --timeout
    bounds the run from."""
    started = time.time() if started_at is None else started_at
    workbench = Workbench(task=task, machine=as_machine(machine), runner=runner, out=out, reporter=reporter)
    return run(workbench, sections(options, task=task), started_at=started)


def run(workbench: Workbench, parts: Sections, *, started_at: float) -> RunDocument:
    """The stages, in their order, on ``workbench``; ``started_at``: what --timeout counts from."""
    probed(workbench)
    space = build_task_space(workbench.task, workbench.machine, parts.search)
    for knob, reason in space.excluded.items():
        workbench.reporter.skipping(knob, reason)
    searched = run_search(workbench, parts.search, parts.sharing, space=space, started_at=started_at,
                          reserve=functools.partial(leave_for_verification, workbench, parts.verify, parts.measure,
                                                    plan=parts.search.plan))

    def verify() -> RunDocument:
        verified = run_verification(workbench, parts.verify, parts.measure, searched=searched,
                                    emit=candidate_emitter(workbench.task, workbench.machine))
        return build_document(workbench, parts.verify, parts.sharing, searched=searched, verified=verified,
                              options=parts.record)

    if searched.place.shared:
        doc = verify_for_the_study(workbench, parts, searched=searched, verify=verify)
    else:
        doc = emit_outputs(workbench, parts.measure, document=verify())
    workbench.reporter.stage("writing the report")
    report(workbench, doc, searched=searched)
    return doc


def probed(workbench: Workbench) -> None:
    """What the probe found that the user should know before the run measures."""
    for w in workbench.machine.warnings:
        workbench.reporter.warn(w)
    inherited = launch.inherited_distributed(os.environ)
    if inherited:
        workbench.reporter.warn(f"{', '.join(inherited)} from your environment are not passed to trials: "
                            "each trial starts its own rank group on this machine")


def verify_for_the_study(workbench: Workbench, parts: Sections, *, searched: Searched,
                         verify: Callable[[], RunDocument]) -> RunDocument:
    """A shared study's result, verified once for all its workers (``shared.verify_once``:
    here, or by another worker, waited for), then emitted here."""
    place = searched.place
    assert place.storage is not None

    def verify_for_all() -> JsonObject:
        # emitted and profiled before it is published: the workers that take it write the
        # same document, the step profile included (profile_emitted keeps one it finds)
        with measure_lock.held(notice=workbench.reporter.warn):
            return emit_outputs(workbench, parts.measure, document=verify()).to_json()

    published, here = shared.verify_once(place.study, place.storage, lock_name=f"{place.name}:verify",
                                         verify=verify_for_all, wait_s=parts.sharing.verify_wait_s,
                                         notice=workbench.reporter.info)
    if not here:
        workbench.reporter.info("another worker of the study verified its result: writing the same outputs here")
    return emit_outputs(workbench, parts.measure, document=RunDocument.from_json(published))


def report(workbench: Workbench, doc: RunDocument, *, searched: Searched) -> None:
    """report.md and report.html beside the outputs; a shared study's connections closed."""
    place = searched.place
    try:
        write_report(workbench.out, doc=doc, study=place.study)
    except Exception as exc:  # a finished run never fails over its report
        workbench.reporter.warn(f"report.md/report.html not written: {exc}")
    if place.storage is not None:  # the API may run many: each would keep its connections open
        place.storage.engine.dispose()
