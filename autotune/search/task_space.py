"""The space stage: what may be searched for a model file on a machine, as the search's
options narrow it (``space.build_space``)."""
from __future__ import annotations

import dataclasses

from autotune.config import Layout
from autotune.probes import Machine
from autotune.sections import SearchOptions
from autotune.space import Space, build_space
from autotune.task import Task
from autotune.task.way_in import ScriptFacts


def build_task_space(task: Task, machine: Machine, search: SearchOptions) -> Space:
    """``task``'s space on ``machine``: its knobs as the model file allows them (its batch, its
    data set, what it has), less what --exact, --fix, --batch-range and --max-quality-drop rule out."""
    space = build_space(machine, baseline_batch=task.batch_size, dataset_len=task.dataset_len,
                       image_inputs=task.image_inputs, batchnorm_layers=task.batchnorm_layers,
                       blocks=task.blocks, optimizer=task.optimizer, convolutions=task.convolutions,
                       has_evaluate=task.has_evaluate, has_training_step=task.has_training_step,
                       max_quality_drop=search.max_quality_drop,
                       exact=search.exact, fixed=search.fixed, batch_range=search.batch_range,
                       scale_lr=search.scale_lr)
    return space if task.script is None else script_space(space, task.script)


def script_space(space: Space, script: ScriptFacts) -> Space:
    """``space`` as a script the user runs can be told it: the knobs its way in can set (a Trainer
    script's TrainingArguments; a Lightning script's Trainer, DataLoader and batch attribute; a
    plain loop's flags and patch) and its process takes, the baseline as the script sets them
    (its batch, workers, precision, compile), and each knob it cannot take named with the reason."""
    choices = dict(space.choices)
    excluded = dict(space.excluded)
    for knob, why in script.skipped().items():
        if knob in choices or any(k.split("=")[0] == knob for k in excluded):
            choices.pop(knob, None)
            excluded = {k: v for k, v in excluded.items() if k.split("=")[0] != knob}
            excluded[knob] = why
    several = [lay for lay in choices["layout"] if Layout.parse(lay).nprocs > 1]
    single = ("its ranks train on another order of the data than one process, which only its quality "
              f"metric could judge, and it has none: {script.unjudged[1]} to search them; threads are searched"
              if script.ranks_reorder and not script.has_eval else None)
    reason = script.no_ranks or single
    if several and reason:
        choices["layout"] = [lay for lay in choices["layout"] if Layout.parse(lay).nprocs == 1]
        excluded["layout=" + ",".join(several)] = reason
    baseline = script.baseline(space.baseline)
    for knob in ("num_workers", "precision", "compile", "prefetch_factor", "batch_size", "grad_accum"):
        value = getattr(baseline, knob)
        if knob in choices and value not in choices[knob]:
            choices[knob] = [value, *choices[knob]]  # the script's own value is always a point
    return dataclasses.replace(space, choices=choices, excluded=excluded, baseline=baseline)

