"""The Python API: the same run as ``autotune run``, from a notebook, a CI job or the
user's own launcher. Re-exported lazily by ``autotune`` (``autotune.tune``): importing
autotune stays cheap, for the trial processes too."""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.errors import UsageError
from autotune.options import RunOptions
from autotune.result import Result

if TYPE_CHECKING:
    from autotune.probes import Machine


def tune(
    model_file: str | os.PathLike[str], *, trials: int = RunOptions.trials,
    timeout: float | None = RunOptions.timeout_s, out: str | os.PathLike[str] | None = None,
    fix: Mapping[str, Any] | Iterable[str] = (), exact: bool = RunOptions.exact,
    max_quality_drop: float | None = RunOptions.max_quality_drop, force: bool = False,
    progress: bool = True, **measurement: Any,
) -> Result:
    """Tune ``model_file`` on this machine and write the same outputs as ``autotune run``
    (``out`` defaults to ``autotune-out/<model name>``). ``fix`` pins knobs
    (``{"batch_size": 64}`` or ``["batch_size=64"]``); ``measurement`` takes the other
    options of a run by their ``RunOptions`` names (``window_s``, ``windows``, ``top``,
    ``rounds``, ``pairs``, ``pair_seconds``, ``trial_timeout_s``, ``hang_timeout_s``).
    ``progress=False`` prints nothing. Returns the Result, verified or not; raises
    ``autotune.ContractError`` for a model file that breaks the contract,
    ``autotune.UsageError`` for a bad argument, ``autotune.errors.NotVerified`` when the
    baseline itself cannot run."""
    from autotune.pipeline import output_folder
    from autotune.pipeline import tune as run_pipeline
    from autotune.report.console import Reporter
    from autotune.space import parse_fixes

    items = [f"{k}={v}" for k, v in fix.items()] if isinstance(fix, Mapping) else list(fix)
    known = {f.name for f in dataclasses.fields(RunOptions)} - {
        "trials", "timeout_s", "fixed", "exact", "max_quality_drop"}
    unknown = sorted(set(measurement) - known)
    if unknown:
        raise UsageError(f"tune(): unknown option {', '.join(unknown)}; the options are "
                         f"{', '.join(sorted(known))}")
    options = RunOptions(trials=trials, timeout_s=timeout, fixed=parse_fixes(items), exact=exact,
                         max_quality_drop=max_quality_drop, **measurement)
    folder = output_folder(Path(model_file), Path(out) if out is not None else None)
    doc = run_pipeline(Path(model_file), out=folder, options=options, reporter=Reporter(quiet=not progress),
                       force=force)
    return Result.from_document(doc, folder)


def probe() -> Machine:
    """What this machine offers (cores, ISA, memory, GPUs, libraries), as autotune reads it."""
    from autotune.probes import probe_machine

    return probe_machine()
