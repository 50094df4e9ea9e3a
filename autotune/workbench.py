"""What every stage of a run works with, the same from the first stage to the last."""
from __future__ import annotations

import dataclasses
from pathlib import Path

from autotune.probes import Machine
from autotune.report.console import Reporter
from autotune.task import Task
from autotune.trials.runner import TrialRunnerLike


@dataclasses.dataclass(frozen=True)
class Workbench:
    """``task``: the model file, as checked; ``machine``: where it is tuned; ``runner``:
    what measures it there; ``out``: the output folder (trials, the study's journal,
    verification's scripts, the outputs); ``reporter``: who is told."""

    task: Task
    machine: Machine
    runner: TrialRunnerLike
    out: Path
    reporter: Reporter
