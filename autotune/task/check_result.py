"""What the model-file check (``autotune.task.check``, a child process) hands back to
``task.load_task``: the file's description, or the ContractError's message. It crosses
the process boundary as a JSON file: ``{"task": fields}`` or ``{"error": message}``."""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from autotune.runtime.json_value import JsonObject
from autotune.runtime.knobs import DEFAULT_OPTIMIZER


@dataclasses.dataclass(frozen=True)
class CheckedFile:
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

    def to_json(self) -> JsonObject:
        return {
            "batch_size": self.batch_size,
            "dataset_len": self.dataset_len,
            "image_inputs": self.image_inputs,
            "has_evaluate": self.has_evaluate,
            "has_training_step": self.has_training_step,
            "parameters": self.parameters,
            "batchnorm_layers": list(self.batchnorm_layers),
            "blocks": list(self.blocks),
            "optimizer": self.optimizer,
            "convolutions": self.convolutions,
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> CheckedFile:
        return cls(
            batch_size=doc["batch_size"],
            dataset_len=doc["dataset_len"],
            image_inputs=doc["image_inputs"],
            has_evaluate=doc["has_evaluate"],
            parameters=doc["parameters"],
            has_training_step=doc.get("has_training_step", False),
            batchnorm_layers=tuple(doc.get("batchnorm_layers", ())),
            blocks=tuple(doc.get("blocks", ())),
            optimizer=doc.get("optimizer", DEFAULT_OPTIMIZER),
            convolutions=bool(doc.get("convolutions", True)),
        )


@dataclasses.dataclass(frozen=True)
class CheckResult:
    """The check's answer: ``checked`` for a file that passed, else ``error``, the
    ContractError's message."""

    checked: CheckedFile | None = None
    error: str | None = None

    def to_json(self) -> JsonObject:
        if self.checked is None:
            return {"error": self.error}
        return {"task": self.checked.to_json()}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> CheckResult:
        if doc.get("error"):
            return cls(error=str(doc["error"]))
        return cls(checked=CheckedFile.from_json(doc["task"]))
