"""What the search and the verification tell whoever shows progress
(``autotune.report.console.Reporter``): a ``Progress`` callback takes the event's kind (a
``ProgressEvent``) and what it carries, one dataclass per kind. Shown, never stored.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import TypeAlias

from autotune.config import TrialConfig
from autotune.trials.protocol import ProgressEvent, Role
from autotune.trials.result import TrialResult


@dataclasses.dataclass(frozen=True)
class TrialStart:
    """``START``: trial ``number`` of ``of`` starts, ``elapsed`` seconds into the search."""

    number: int
    of: int
    config: TrialConfig
    role: Role | None
    elapsed: float


@dataclasses.dataclass(frozen=True)
class TrialWindow:
    """``WINDOW``: the trial measured window ``i`` at ``value`` samples/s."""

    i: int
    value: float


@dataclasses.dataclass(frozen=True)
class TrialEnd:
    """``END``: a trial ended; the best value so far; under a planned run, its predicted time
    (``planned_s``, ``one_time_s``) and the best's (``best_planned_s``: search.scoring)."""

    result: TrialResult
    config: TrialConfig | None = None
    role: Role | None = None
    best: float | None = None
    planned: Mapping[str, float | None] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class StaleTrial:
    """``STALE``: trial ``number``, left running by an interrupted run, was marked failed."""

    number: int


@dataclasses.dataclass(frozen=True)
class BudgetStop:
    """``BUDGET``: the search stopped before its trial count, and why."""

    reason: str


@dataclasses.dataclass(frozen=True)
class VerifyStep:
    """``STEP``: a stage of the verification begins or ends, or takes its next step. ``stage``:
    which (a ``document.stages.Stage`` value: "gates", "speed", "ablation", "standalone"),
    where the step belongs to one; ``step`` of at most ``of``: its standalone pair."""

    text: str
    stage: str | None = None
    step: int | None = None
    of: int | None = None


@dataclasses.dataclass(frozen=True)
class SpeedRound:
    """``SPEED``: round ``round`` of at most ``rounds`` of the side-by-side speed check."""

    round: int
    rounds: int


ProgressInfo: TypeAlias = TrialStart | TrialWindow | TrialEnd | StaleTrial | BudgetStop | VerifyStep | SpeedRound
Progress: TypeAlias = Callable[[ProgressEvent, ProgressInfo], None]


def no_progress(kind: ProgressEvent, info: ProgressInfo) -> None:
    """A ``Progress`` that shows nothing."""
