"""A run's document, ``RunDocument``, which is best_config.json: the measured parts, the
ablation, the search's and the space's summaries; and ``CandidateDocument``, the
best_config.json beside a verification candidate's scripts."""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated

from pydantic import Field, computed_field
from pydantic.json_schema import JsonSchemaValue

from autotune.config import KnobValue, TrialConfig
from autotune.document.ablation import Ablation
from autotune.document.batch import BatchChoice
from autotune.document.kept import Kept
from autotune.document.measures import (
    Baseline,
    Best,
    CandidateOutcome,
    Check,
    LayoutEffect,
    PrecisionNote,
    Rejection,
    Rounds,
    VerifiedSpeedup,
)
from autotune.document.memory import MemoryFit
from autotune.document.plan import PlanPrediction
from autotune.document.stages import VerificationStages
from autotune.document.steering import Steering
from autotune.document.utilisation import Utilisation
from autotune.runtime.json_value import JsonValue
from autotune.runtime.step_profile import StepProfile
from autotune.schemas import typed
from autotune.schemas.typed import Omitted, OmittedEmpty, Record


@dataclasses.dataclass(frozen=True, kw_only=True)
class SearchFailure(Record):
    """A search trial that failed: how (a ``Failure`` value; None where the trial did not
    say), its message and the end of its log."""

    number: int
    config: TrialConfig
    failure: str | None
    message: str
    log_tail: str

@dataclasses.dataclass(frozen=True, kw_only=True)
class Ranked(Record):
    """One configuration of the search's ranking (its short form), its steady throughput
    and, under a planned run, the run's predicted wall time (what ranked it)."""

    config: str
    samples_per_s: float
    planned_s: Omitted[float] = None

@dataclasses.dataclass(frozen=True, kw_only=True)
class SearchSummary(Record):
    """What the search did: its trials, those that cost a measurement, the failures and
    the fastest configurations it found (at most ten, fastest first)."""

    trials: int
    measured: int
    failures: tuple[SearchFailure, ...]
    ranking: tuple[Ranked, ...]
    study: Omitted[str] = None
    storage: Omitted[str] = None  # a shared study's database, its password masked

@dataclasses.dataclass(frozen=True, kw_only=True)
class SpaceSummary(Record):
    """The search space: each knob's values (one value: not searched), the knobs the user
    fixed, and what was left out on this machine ("knob" or "knob=value") with why."""

    included: Mapping[str, Sequence[KnobValue]]
    fixed: Mapping[str, KnobValue]
    excluded: Mapping[str, str]

@dataclasses.dataclass(frozen=True, kw_only=True)
class ScriptRecord(Record):
    """A run of a script the user runs: its kind ("hf_trainer", "lightning", "loop"), what its
    answer changes (``stack``: its TrainingArguments...), the arguments it
    was tuned with, whether it parses its TrainingArguments from them, what differs for the
    emitted configuration (``arguments``: TrainingArguments fields; for Lightning, its Trainer's
    and DataLoader's keyword arguments, its batch size and compile), ``flags``: the same as its
    command line takes them, and ``lines``: the same as the changes to make in the script."""

    kind: str
    stack: str = "TrainingArguments"
    argv: tuple[str, ...] = ()
    parsed: bool = False
    arguments: Mapping[str, JsonValue] = dataclasses.field(default_factory=dict)
    flags: tuple[str, ...] = ()
    lines: OmittedEmpty[tuple[str, ...]] = ()

    def said(self) -> str:
        """The tuned arguments as the script takes them: flags, or keyword arguments."""
        if self.lines:
            return "; ".join(self.lines)
        if self.parsed:
            return " ".join(self.flags)
        return ", ".join(f"{k}={v!r}" for k, v in self.arguments.items())


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunDocument(Record):
    """best_config.json. ``schema``, ``model_file_tuned``, ``launch`` and ``outputs`` are
    added where the files are written (``autotune.emit.outputs.write_outputs``); a document read
    back from the folder carries them."""

    schema: Omitted[int] = None
    model_file: str
    autotune_version: str
    fingerprint: Mapping[str, JsonValue]
    config: TrialConfig
    baseline: Baseline
    best: Best | None  # None: nothing verified, the baseline is emitted
    speedup: VerifiedSpeedup | None  # None: nothing verified, nothing measured against the baseline
    verification: Mapping[str, Check]  # the emitted configuration's checks
    precision: PrecisionNote
    rejected: tuple[Rejection, ...]
    candidates: tuple[CandidateOutcome, ...]
    search: SearchSummary
    space: SpaceSummary
    layout_effect: LayoutEffect | None
    ablation: Omitted[Ablation] = None
    plan: Omitted[PlanPrediction] = None  # None: no run was planned (--train-steps, --epochs)
    memory: Omitted[MemoryFit] = None  # None: a document from before memory was measured
    batch: Omitted[BatchChoice] = None  # None: a document from before the batch was judged
    step_profile: Omitted[StepProfile] = None  # None: not profiled (--no-profile, or it failed)
    steering: Omitted[Steering] = None  # None: the search profiled no leader
    utilisation: Omitted[Utilisation] = None  # None: no FLOPs counted (or a document from before)
    # Nothing verified, and a candidate faster by its standalone pairs' median: named, not emitted
    kept: Omitted[Kept] = None
    # how verification's stages ran, and what --timeout shortened
    stages: Annotated[Omitted[VerificationStages], Field(alias="verification_stages")] = None
    environment: Mapping[str, str]
    # The options the run was given (autotune.document.options.options_record); None: a
    # document from before they were recorded.
    options: Omitted[Mapping[str, JsonValue]] = None
    model_file_tuned: Omitted[str] = None
    launch: Omitted[str] = None
    outputs: Omitted[Mapping[str, str]] = None
    script: Omitted[ScriptRecord] = None  # None: a model file

    @computed_field  # type: ignore[prop-decorator]
    @property
    def verified(self) -> bool:
        return self.speedup is not None

    @property
    def fingerprint_id(self) -> str | None:
        """The machine's fingerprint id, which the study's name carries."""
        found = self.fingerprint.get("id")
        return found if isinstance(found, str) else None

    @property
    def included(self) -> Mapping[str, Sequence[KnobValue]]:
        """The search space: each knob's values (one value: not searched)."""
        return self.space.included

    @property
    def excluded(self) -> Mapping[str, str]:
        """What the search left out on this machine ("knob" or "knob=value"), and why."""
        return self.space.excluded

    @property
    def side_by_side_rounds(self) -> Rounds | None:
        """The speed check's rounds, the emitted configuration and the baseline side by side."""
        return Rounds.from_check(self.verification.get("speed"))

    @property
    def standalone_pairs(self) -> Rounds | None:
        """The standalone pairs the printed speedup comes from."""
        return Rounds.from_check(self.verification.get("standalone"))

@dataclasses.dataclass(frozen=True, kw_only=True)
class CandidateDocument(Record):
    """best_config.json beside the scripts of a configuration that a verification runs (not
    a run's result): which configuration they train, and where the files are, as
    ``autotune.emit.outputs.write_candidate`` wrote them."""

    schema: int
    config: Annotated[TrialConfig, Field(alias="candidate")]
    model_file: str
    model_file_tuned: str
    launch: str
    outputs: Mapping[str, str]


SCHEMA_FILE = Path(__file__).resolve().parent.parent / "schemas" / "best_config.schema.json"


def run_document_schema() -> JsonSchemaValue:
    """The JSON Schema of best_config.json (and of ``run --json`` and ``show --json``),
    generated from ``RunDocument``: a written document always carries its schema version
    and its outputs."""
    generated = typed.schema(RunDocument)
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": "autotune/best_config.schema.json",
            "title": "autotune best_config.json",
            "description": "The result document of `autotune run`: the verified configuration, its baseline, "
                           "the speedup measured as the user runs it, and the outputs written beside it. "
                           "Generated from the document's types: python -c 'from autotune.document.run import "
                           "write_schema; write_schema()'",
            **{k: v for k, v in generated.items() if k not in ("title", "description", "required")},
            "required": sorted({*generated.get("required", []), "schema", "outputs"})}


def write_schema() -> None:
    """Write ``run_document_schema()`` over the shipped schema file."""
    SCHEMA_FILE.write_text(json.dumps(run_document_schema(), indent=1) + "\n")
