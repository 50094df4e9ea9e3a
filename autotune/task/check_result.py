"""What the model-file check (``autotune.task.check``, a child process) hands back to
``task.load_task``: the file's description, or the ContractError's message. It crosses
the process boundary as a JSON file: ``{"task": fields}`` or ``{"error": message}``."""
from __future__ import annotations

import dataclasses
from typing import Annotated

from pydantic import Field

from autotune.runtime.knobs import DEFAULT_OPTIMIZER
from autotune.schemas.typed import Omitted, Record


@dataclasses.dataclass(frozen=True)
class CheckedFile(Record):
    """A valid model file as the check saw it: every Task field but path and check_s
    (see task.Task for what each means)."""

    batch_size: int
    dataset_len: int | None
    image_inputs: bool
    has_evaluate: bool
    parameters: int
    has_training_step: bool = False
    batchnorm_layers: tuple[str, ...] = ()
    blocks: tuple[str, ...] = ()
    optimizer: str = DEFAULT_OPTIMIZER
    convolutions: bool = True
    evaluate_s: float = 0.0


@dataclasses.dataclass(frozen=True)
class CheckResult(Record):
    """The check's answer: ``checked`` for a file that passed, else ``error``, the
    ContractError's message."""

    checked: Annotated[Omitted[CheckedFile], Field(alias="task")] = None
    error: Omitted[str] = None
