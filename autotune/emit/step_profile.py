"""Where the pick's step goes: after the outputs are written, the emitted launch.sh runs
once more with ``--profile`` (``autotune.runtime.profile``), as the user runs it, alone on
the machine and outside every timed measurement; its shares go into best_config.json's
``step_profile`` and the report."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from autotune.document import paths
from autotune.document.run import RunDocument
from autotune.emit import outputs
from autotune.outdir import write_atomically
from autotune.runtime.step_profile import StepProfile
from autotune.trials.runner import TrialRunner, TrialRunnerLike, run_launcher
from autotune.workbench import Reporting

PROFILE_DIR = "profile"  # in the output folder: the profiled run's log and report


def profile_emitted(out: Path, doc: RunDocument, *, runner: TrialRunnerLike, profile: bool,
                    reporter: Reporting) -> RunDocument:
    """``doc`` with the emitted script's step profile, rewritten to best_config.json; ``doc``
    itself under --no-profile, with a stand-in runner (it measures nothing), where it has a
    profile (a shared study's published result, profiled by the worker that verified it), or
    where the profiled run failed (a warning says why: a finished run never fails over it)."""
    if not profile or not isinstance(runner, TrialRunner) or doc.step_profile is not None:
        return doc
    reporter.stage("profiling the answer")
    reporter.info("profiling one window of the emitted script: where its step goes ...")
    runner.close()  # alone on the machine, as the standalone runs were
    try:
        report = run_launcher(paths.resolve(doc, out, "launcher"), steps=1, workdir=out / PROFILE_DIR,
                              timeout_s=runner.timeout_s, cwd=runner.cwd, extra=("--profile",),
                              compile_cache=runner.compile_cache)
        taken = StepProfile.from_json(report.step_profile)
    except (RuntimeError, KeyError, ValueError, TypeError) as exc:
        reporter.warn(f"the step profile was not taken (logs in {out / PROFILE_DIR}): {exc}")
        return doc
    profiled = dataclasses.replace(doc, step_profile=taken)
    write_atomically(out / outputs.CONFIG_NAME, json.dumps(profiled.to_json(), indent=2, default=str) + "\n")
    return profiled
