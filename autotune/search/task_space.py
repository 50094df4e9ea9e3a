"""The space stage: what may be searched for a model file on a machine, as the search's
options narrow it (``space.build_space``)."""
from __future__ import annotations

from autotune.probes import Machine
from autotune.sections import SearchOptions
from autotune.space import Space, build_space
from autotune.task import Task


def build_task_space(task: Task, machine: Machine, search: SearchOptions) -> Space:
    """``task``'s space on ``machine``: its knobs as the model file allows them (its batch, its
    data set, what it has), less what --exact, --fix, --batch-range and --max-quality-drop rule out."""
    return build_space(machine, baseline_batch=task.batch_size, dataset_len=task.dataset_len,
                       image_inputs=task.image_inputs, batchnorm_layers=task.batchnorm_layers,
                       blocks=task.blocks, optimizer=task.optimizer, convolutions=task.convolutions,
                       has_evaluate=task.has_evaluate, has_training_step=task.has_training_step,
                       max_quality_drop=search.max_quality_drop,
                       exact=search.exact, fixed=search.fixed, batch_range=search.batch_range,
                       scale_lr=search.scale_lr)
