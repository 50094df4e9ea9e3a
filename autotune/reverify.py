"""Verify a tuned configuration again, here and now: the same checks as a run's
verification, the user's emitted launch.sh against the baseline's script written afresh.

Useful later, or on another machine: it warns when this machine's fingerprint differs
from the one the configuration was tuned on, and says plainly when the speedup measured
now lies outside the interval printed when it was tuned. The result is also written to
``OUTDIR/reverify.json``.
"""
from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

from autotune import outdir
from autotune.document import paths
from autotune.document.measures import Interval, VerifiedSpeedup
from autotune.emit.outputs import candidate_emitter
from autotune.harness import make_runner, waiting_notice
from autotune.options import RunOptions
from autotune.probes import MachineLike, as_machine, fingerprint, fingerprint_diff, probe_machine
from autotune.report.console import Reporter
from autotune.result import read_document
from autotune.sections import MeasureOptions, VerifyOptions
from autotune.task import load_task
from autotune.trials import measure_lock, proctree
from autotune.trials.runner import TrialRunnerLike
from autotune.verify.reverified import Reverified
from autotune.verify.stage import recheck
from autotune.workbench import Workbench


def reverify(out: str | os.PathLike[str], *, options: RunOptions, reporter: Reporter,
             machine: MachineLike | None = None,
             runner: TrialRunnerLike | None = None,
             model_file: str | os.PathLike[str] | None = None) -> Reverified:
    """Measure the configuration in ``out`` against its baseline again (where it emitted the
    baseline, the one it kept: ``RunDocument.kept``); returns what it found (``Reverified``,
    also written to reverify.json). The folder may have been copied or moved: its model
    file is found relative to it, else where it was tuned, unless ``model_file`` names it;
    both scripts train that file. ``machine`` and ``runner`` default to this machine's probe
    and a real trial runner (tests pass stand-ins)."""
    doc = read_document(out)
    folder = Path(out)
    folder = (folder if folder.is_dir() else folder.parent).absolute()
    task = load_task(paths.model_file(doc, folder, override=model_file))
    cfg, baseline = doc.config, doc.baseline.config
    machine = as_machine(machine) if machine is not None else probe_machine()
    tuned_on = {k: v for k, v in doc.fingerprint.items() if k != "id"}
    differs = fingerprint_diff(tuned_on, fingerprint(machine.to_json()))
    for line in differs:
        reporter.warn(f"this machine differs from the one the config was tuned on: {line}")
    kept = doc.kept if cfg == baseline else None
    if cfg == baseline and kept is None:
        return Reverified(verified=False, reason="the configuration is the baseline itself: nothing to verify")
    kept_launcher = folder / kept.launcher if kept is not None else None
    if kept is not None and kept_launcher is not None:
        if not kept_launcher.exists():  # a copy without verify/, or a shared study's other workers
            return Reverified(verified=False, kept=kept.launcher, reason=(
                f"the run emitted the baseline and kept {kept.config.short()}, whose scripts are not in "
                f"this folder ({kept_launcher}): nothing to verify"))
        reporter.info(f"the run emitted the baseline: measuring the configuration it kept, {kept.config.short()} "
                      f"({kept_launcher}), against the baseline's script")
    proctree.become_subreaper()
    previous = os.environ.get("MODEL_FILE")
    os.environ["MODEL_FILE"] = str(task.path)  # what the user's launch.sh trains here
    try:
        with outdir.exclusive(folder), measure_lock.held(notice=waiting_notice(reporter.warn)), \
                contextlib.ExitStack() as stack:
            if runner is None:
                runner = make_runner(task, machine, folder, MeasureOptions.of(options))
                stack.callback(runner.shutdown)  # its warm processes and interpreters: verification is over
            workbench = Workbench(task=task, machine=machine, runner=runner, out=folder, reporter=reporter)
            # the user's launch.sh (or the kept one's) as it is; the baseline's script written afresh
            winner, verdicts, base_speed = recheck(
                workbench, VerifyOptions.of(options), doc=doc, config=kept.config if kept is not None else None,
                launcher=lambda: kept_launcher or paths.resolve(doc, folder, "launcher"),
                emit_baseline=candidate_emitter(task, machine))
    finally:
        if previous is None:
            os.environ.pop("MODEL_FILE", None)
        else:
            os.environ["MODEL_FILE"] = previous
        proctree.reap_orphans()
    verdict = verdicts[0]
    alone = verdict.standalone
    now = alone.speedup if alone is not None else None
    printed = doc.speedup.interval if doc.speedup is not None else kept.interval if kept is not None else None
    result = Reverified(
        verified=winner is not None, reason=verdict.reason if winner is None else None,
        baseline_samples_per_s=(alone.baseline_median_samples_per_s if alone is not None
                                else base_speed.median_samples_per_s if base_speed is not None else None),
        speedup=now, printed_when_tuned=doc.speedup, checks=dict(verdict.checks), fingerprint_differs=bool(differs),
        outside_printed_interval=outside_printed(now, printed), kept=kept.launcher if kept is not None else None)
    (folder / "reverify.json").write_text(json.dumps(result.to_json(), indent=2) + "\n")
    return result


def outside_printed(now: VerifiedSpeedup | None, printed: Interval | None) -> str | None:
    """A plain sentence when the speedup measured now lies outside the interval printed
    when the configuration was tuned; None when inside (or nothing to compare)."""
    if now is None or printed is None:
        return None
    low, high, median = printed.low, printed.high, now.interval.ratio
    if low <= median <= high:
        return None
    side = "below" if median < low else "above"
    return (f"the speedup measured now, {median:.2f}x, is {side} the interval printed when this "
            f"configuration was tuned ({low:.2f}-{high:.2f}x, median {printed.ratio:.2f}x): "
            "this machine runs the two scripts differently now (its load, its other tenants, or "
            "what changed since) - trust today's figure, and tune again if it matters")
