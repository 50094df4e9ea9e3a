"""What every stage of a run works with, the same from the first stage to the last."""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

from autotune.probes import Machine
from autotune.task import Task
from autotune.trials.progress import ProgressInfo
from autotune.trials.protocol import ProgressEvent
from autotune.trials.runner import TrialRunnerLike


class Reporting(Protocol):
    """Who is told, as the stages tell them: a line, a warning, the search's and
    verification's progress (``report.console.Reporter`` on a terminal). The stages know
    this much of the console and no more."""

    def info(self, text: str) -> None: ...

    def warn(self, text: str) -> None: ...

    def skipping(self, knob: str, reason: str) -> None: ...

    def search(self, kind: ProgressEvent, info: ProgressInfo) -> None: ...

    def verify(self, kind: ProgressEvent, info: ProgressInfo) -> None: ...

    def stage(self, name: str, *, estimate_s: Mapping[str, float] | None = None) -> None: ...

    def clock(self, *, started_at: float, timeout_s: float | None) -> None: ...


@dataclasses.dataclass(frozen=True)
class Workbench:
    """``task``: the model file, as checked; ``machine``: where it is tuned; ``runner``:
    what measures it there; ``out``: the output folder (trials, the study's journal,
    verification's scripts, the outputs); ``reporter``: who is told."""

    task: Task
    machine: Machine
    runner: TrialRunnerLike
    out: Path
    reporter: Reporting
