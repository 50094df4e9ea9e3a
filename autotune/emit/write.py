"""The emit stage: the chosen configuration's outputs written to the output folder (its
train_tuned.py, launch.sh, best_config.json with this machine's environment), then where
its step goes, profiled once (``emit.step_profile``)."""
from __future__ import annotations

import dataclasses

from autotune.document.run import RunDocument
from autotune.emit import outputs, step_profile
from autotune.sections import MeasureOptions
from autotune.trials import launch
from autotune.workbench import Workbench


def emit_outputs(workbench: Workbench, measure: MeasureOptions, *, document: RunDocument) -> RunDocument:
    """``document``'s configuration written out with this machine's environment (a shared
    study's verified document too: each machine writes its own); returns the document as
    written."""
    machine, task = workbench.machine, workbench.task
    env, warnings = launch.environment(document.config, machine=machine)
    for w in warnings:
        workbench.reporter.warn(w)
    doc = outputs.write_outputs(workbench.out, cfg=document.config, model_file=task.path, env=env,
                                document=dataclasses.replace(document, environment=env),
                                description=f"Train {task.path.name} with the configuration "
                                            "autotune verified on this machine.",
                                default_threads=machine.torch.num_threads, blocks=task.blocks,
                                script=task.script)
    # a Trainer script's step runs inside the user's Trainer, which run_tuned.py does not profile
    return step_profile.profile_emitted(workbench.out, doc, runner=workbench.runner,
                                        profile=measure.profile and task.script is None,
                                        reporter=workbench.reporter)
