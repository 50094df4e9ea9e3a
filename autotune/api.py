"""The Python API: the same run as ``autotune run``, from a notebook, a CI job or the
user's own launcher. Re-exported lazily by ``autotune`` (``autotune.tune``): importing
autotune stays cheap, for the trial processes too."""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.config import KnobValue
from autotune.errors import UsageError
from autotune.options import RunOptions, flag_of, keyword_of
from autotune.result import Result

if TYPE_CHECKING:
    from autotune.probes import Machine


def tune(
    model_file: str | os.PathLike[str], *, trials: int = RunOptions.trials,
    timeout: float | None = RunOptions.timeout_s, out: str | os.PathLike[str] | None = None,
    fix: Mapping[str, KnobValue] | Iterable[str] = (), exact: bool = RunOptions.exact,
    max_quality_drop: float | None = RunOptions.max_quality_drop,
    train_steps: int | None = RunOptions.train_steps, epochs: int | None = RunOptions.epochs,
    memory_limit: str | float | None = None, scale_lr: str = RunOptions.scale_lr,
    force: bool = False, progress: bool = True, script_args: Iterable[str] = (), **measurement: Any,
) -> Result:
    """Tune ``model_file`` on this machine: the run ``autotune run`` makes, with the same
    outputs (best_config.json, train_tuned.py, launch.sh, the report) written to ``out``.

    Args:
        model_file: The model file (its ``build_model`` and ``build_dataset``, and
            optionally ``evaluate`` and the rest of the contract).
        trials: How many configurations the search measures.
        timeout: The whole run's limit in seconds, verification included (the search
            gets half of it; verification's stages are fitted to the rest); None for none.
        out: The output folder; default ``autotune-out/<model file's name>``.
        fix: Knobs pinned to one value, as a mapping (``{"batch_size": 64}``) or spelled
            as on the command line (``["batch_size=64"]``).
        exact: Search only configurations that compute what the baseline computes: fp32,
            nothing pruned.
        max_quality_drop: How far ``evaluate()``'s metric may drop; allows structured
            pruning and replaces the default allowance for reduced precision.
        train_steps: The run you plan, in steps of your batch size: configurations are
            ranked by its predicted wall time, one-time costs (compiling) included, and
            best_config.json's ``plan`` says after how many steps each compiled
            configuration pays off. None (and no ``epochs``): steady throughput.
        epochs: The run you plan, in passes over the data set (which must have a
            length); not with ``train_steps``.
        memory_limit: The most memory one rank may hold: a size (``"6GiB"``) or MiB (a
            number); host memory per process on CPU, memory per GPU on CUDA. None: what
            the machine has, less a margin.
        scale_lr: How the learning rate follows a tuned batch size unlike the model
            file's: ``"linear"`` multiplies every parameter group's ``lr`` by the tuned
            global batch over yours, ``"sqrt"`` by that ratio's square root, in the trials,
            the verification and the emitted script; ``"none"`` leaves it unchanged.
        force: Write into an existing folder that autotune did not make.
        progress: Print progress and the summary; False prints nothing.
        script_args: For a script you run (a training loop, a Trainer or Lightning script),
            the arguments it runs with (what ``autotune run SCRIPT -- ARGS`` gives it).
        **measurement: The other options of a run, every field of ``RunOptions`` not
            named above, by its name (each is the flag of ``autotune run`` that --help
            describes): ``window_s``, ``windows``, ``top``, ``rounds``, ``pairs``, ``pair_seconds``,
            ``path`` (also measure the ablation's path from the baseline),
            ``batch_range`` (``(LOW, HIGH)`` or ``"LOW-HIGH"``: the global batches the search
            may try, in place of the range measured on the machine), ``trial_timeout_s``,
            ``hang_timeout_s``, ``warm_trials``, ``profile``; for a plain training loop,
            ``metric`` (a regular expression for the metric its script prints, its number in
            a group) and ``metric_lower_is_better``;
            for a study shared by several machines,
            ``storage`` (a PostgreSQL URL), ``study``, ``heartbeat_s``, ``verify_wait_s``.

    Returns:
        The run's ``Result``, verified or not: not verified when no candidate passed
        verification, and then the baseline's configuration was emitted.

    Raises:
        autotune.ContractError: The model file breaks the contract.
        autotune.UsageError: An unknown option or knob, options that contradict each
            other, or an ``out`` folder that cannot be used.
        autotune.errors.NotVerified: The baseline itself failed: nothing could be
            compared with it.
    """
    from autotune.pipeline import output_folder
    from autotune.pipeline import tune as run_pipeline
    from autotune.report.console import Reporter

    options = run_options(named={"trials": trials, "timeout": timeout, "fix": fix, "exact": exact,
                                 "max_quality_drop": max_quality_drop, "train_steps": train_steps,
                                 "epochs": epochs, "memory_limit": memory_limit, "scale_lr": scale_lr},
                          more=measurement)
    folder = output_folder(Path(model_file), Path(out) if out is not None else None)
    reporter = Reporter(quiet=not progress, live=False)  # lines, as a notebook's cell or a log shows them
    doc = run_pipeline(Path(model_file), out=folder, options=options, reporter=reporter, force=force,
                       script_args=tuple(str(a) for a in script_args))
    return Result.from_document(doc, folder)


def run_options(*, named: Mapping[str, object], more: Mapping[str, object],
                options: type[RunOptions] = RunOptions) -> RunOptions:
    """``options`` from tune()'s keywords: ``named``, its own parameters, and ``more``, the
    rest, which must each be an option's keyword (``keyword_of``; a field's name unless
    its Flag says otherwise) that ``named`` does not give. What a Flag parses (a size, a
    batch range, knobs) is parsed, named as the keyword."""
    fields = {keyword_of(f): f for f in dataclasses.fields(options)}
    known = set(fields) - set(named)
    unknown = sorted(set(more) - known)
    if unknown:
        raise UsageError(f"tune(): unknown option {', '.join(unknown)}; the options are "
                         f"{', '.join(sorted(known))}")
    given: dict[str, Any] = {}
    for keyword, value in {**named, **more}.items():
        field = fields[keyword]
        flag = flag_of(field)
        parse = flag.parse if flag is not None else None
        given[field.name] = parse(value, keyword) if parse is not None and value is not None else value
    return options(**given)


def probe() -> Machine:
    """What this machine offers (cores, ISA, memory, GPUs, libraries), as autotune reads it."""
    from autotune.probes import probe_machine

    return probe_machine()
