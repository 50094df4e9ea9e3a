"""A way in: how autotune enters the training a user already has.

The model file is the first way in (``task.load``); every other is a script the user runs, and
each of those is its own modules: one in task/ that recognises its source, checks it in a child
process and holds what the check learned (its facts, a ``ScriptFacts``), and one in runtime/
that holds its training step by step (a ``runtime.stepper.Stepper``) and ships in the emitted
``tuned_runtime/``. The stages (space, search, verify, emit, report) and the trials' worker
speak only to ``ScriptFacts``; ``task.ways`` registers them, in the order their recognition is tried.
"""
from __future__ import annotations

import ast
import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from autotune.config import TrialConfig
from autotune.runtime.json_value import JsonObject


class ScriptFacts(Protocol):
    """What a script's check learned, and what it answers for the stages: its knobs (which it
    skips, and why; its baseline; a configuration's ``overrides`` in its own terms), how a
    trial runs a configuration (``trial``; ``stepper``: the ``module:Class`` of its Stepper),
    what is emitted (``template``, ``hooks``) and how the answer is said."""

    @property
    def kind(self) -> str: ...
    @property
    def source_module(self) -> str: ...  # the package it trains with (the warm interpreter imports it)
    @property
    def stack(self) -> str: ...  # what its answer changes, for the messages ("TrainingArguments")
    @property
    def argv(self) -> tuple[str, ...]: ...
    @property
    def parsed(self) -> bool: ...  # its answer goes on its command line
    @property
    def metric(self) -> str: ...
    @property
    def greater_is_better(self) -> bool: ...
    @property
    def has_eval(self) -> bool: ...
    @property
    def scored_by(self) -> str: ...  # what scores its quality, for the verdicts' words
    @property
    def user_values(self) -> JsonObject: ...
    @property
    def no_ranks(self) -> str | None: ...  # why it runs as one process only; None: its ranks are searched
    @property
    def ranks_reorder(self) -> bool: ...  # its ranks see another data order than one process
    @property
    def dataset_len(self) -> int | None: ...
    @property
    def parameters(self) -> int: ...
    @property
    def per_device(self) -> int: ...
    @property
    def accumulation(self) -> int: ...
    @property
    def length_keys(self) -> tuple[str, str]: ...  # where its training's length is: steps, epochs
    @property
    def unjudged(self) -> tuple[str, str]: ...  # without its quality metric: why, and the fix
    @property
    def stepper(self) -> str: ...
    @property
    def template(self) -> str: ...  # the emitted run_tuned.py, in autotune/templates/
    @property
    def hooks(self) -> tuple[str, ...]: ...  # the runtime/ modules run_tuned.py needs

    def describe(self) -> str: ...
    def skipped(self) -> dict[str, str]: ...
    def baseline(self, cfg: TrialConfig) -> TrialConfig: ...
    def overrides(self, cfg: TrialConfig) -> JsonObject: ...
    def said(self, overrides: JsonObject) -> list[str]: ...
    def flags(self, overrides: JsonObject) -> list[str]: ...
    def argv_with(self, overrides: JsonObject) -> list[str]: ...
    # scored: a quality gate's training (it runs the answer's length, where that differs)
    def trial(self, overrides: JsonObject, *, scored: bool = False) -> tuple[tuple[str, ...], JsonObject]: ...
    def emitted(self, overrides: JsonObject, *, script: Path) -> dict[str, str]: ...  # more files, by name
    def instructions(self, overrides: JsonObject, *, script: Path) -> list[str]: ...  # tuned_arguments.md
    def to_json(self) -> JsonObject: ...


@dataclasses.dataclass(frozen=True)
class PrintedMetric:
    """The metric a script prints, as the user named it (``--metric``): a regular expression
    whose group (or whole match) is the number, and which way is better."""

    pattern: str
    greater_is_better: bool = True


@dataclasses.dataclass(frozen=True)
class WayIn:
    """One way in for a script: what recognises its source, what checks it (the facts and
    the check's seconds, or ContractError), and what the Task it makes knows of its model."""

    kind: str
    facts: type  # its ScriptFacts class
    recognises: Callable[[ast.Module], bool]
    check: Callable[[Path, Sequence[str], float], tuple[Any, float]]
    # the Task's fields from the facts: image_inputs, optimizer (what can fuse its step)
    task_fields: Callable[[Any], dict[str, Any]]
    # a file that also defines names of the model file's contract is a model file (checked as one,
    # and told what it lacks) rather than this way's script
    after_model_file: bool = False
    # the facts judged by a metric the script prints (``--metric``); None: a way whose quality
    # comes from its framework's own evaluation, which takes no --metric
    with_metric: Callable[[Any, PrintedMetric], Any] | None = None
