"""What a trial's worker trains and measures (``TrainingSession``): a model file's ``Session``
(``runtime.session``) or a script's (``trials.script_session``), spoken to the same way, so that
one measurement, one set of gate trainings and one served window serve every way in."""
from __future__ import annotations

import contextlib
from typing import Any, Protocol

from autotune.runtime.distributed import Distributed


class TrainingSession(Protocol):
    """One configuration's training in this process: its rank (``dist``), the DataLoader it
    draws from, the samples a step takes, steps on command, and the model the quality gate
    scores with the user's own evaluation (``user.evaluate``)."""

    dist: Distributed

    @property
    def loader(self) -> Any: ...
    @property
    def global_batch(self) -> int: ...
    @property
    def user(self) -> Any: ...
    def run_steps(self, n: int) -> tuple[float, list[float]]: ...
    def step(self) -> Any: ...
    def evaluation_model(self) -> contextlib.AbstractContextManager[Any]: ...
    def release(self) -> None: ...
    def close(self) -> None: ...
