"""A run's document, ``RunDocument``, which is best_config.json: the measured parts, the
ablation, the search's and the space's summaries; and ``CandidateDocument``, the
best_config.json beside a verification candidate's scripts."""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

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
    json_list,
    optional_fields,
)
from autotune.document.memory import MemoryFit
from autotune.document.plan import PlanPrediction
from autotune.document.stages import VerificationStages
from autotune.document.steering import Steering
from autotune.document.utilisation import Utilisation
from autotune.runtime.json_value import JsonObject, JsonValue
from autotune.runtime.step_profile import StepProfile


@dataclasses.dataclass(frozen=True, kw_only=True)
class SearchFailure:
    """A search trial that failed: how (a ``Failure`` value; None where the trial did not
    say), its message and the end of its log."""

    number: int
    config: TrialConfig
    failure: str | None
    message: str
    log_tail: str

    def to_json(self) -> JsonObject:
        return {"number": self.number, "config": self.config.to_dict(), "failure": self.failure,
                "message": self.message, "log_tail": self.log_tail}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SearchFailure:
        return cls(number=data["number"], config=TrialConfig.from_dict(data["config"]),
                   failure=data["failure"], message=data["message"], log_tail=data["log_tail"])


@dataclasses.dataclass(frozen=True, kw_only=True)
class Ranked:
    """One configuration of the search's ranking (its short form), its steady throughput
    and, under a planned run, the run's predicted wall time (what ranked it)."""

    config: str
    samples_per_s: float
    planned_s: float | None = None

    def to_json(self) -> JsonObject:
        return {"config": self.config, "samples_per_s": self.samples_per_s,
                **optional_fields(planned_s=self.planned_s)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Ranked:
        return cls(config=data["config"], samples_per_s=data["samples_per_s"],
                   planned_s=data.get("planned_s"))


@dataclasses.dataclass(frozen=True, kw_only=True)
class SearchSummary:
    """What the search did: its trials, those that cost a measurement, the failures and
    the fastest configurations it found (at most ten, fastest first)."""

    trials: int
    measured: int
    failures: tuple[SearchFailure, ...]
    ranking: tuple[Ranked, ...]
    study: str | None = None
    storage: str | None = None  # a shared study's database, its password masked

    def to_json(self) -> JsonObject:
        return {"trials": self.trials, "measured": self.measured, "failures": json_list(self.failures),
                "ranking": json_list(self.ranking),
                **optional_fields(study=self.study, storage=self.storage)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SearchSummary:
        return cls(trials=data["trials"], measured=data["measured"],
                   failures=tuple(SearchFailure.from_json(f) for f in data["failures"]),
                   ranking=tuple(Ranked.from_json(r) for r in data["ranking"]),
                   study=data.get("study"), storage=data.get("storage"))


@dataclasses.dataclass(frozen=True, kw_only=True)
class SpaceSummary:
    """The search space: each knob's values (one value: not searched), the knobs the user
    fixed, and what was left out on this machine ("knob" or "knob=value") with why."""

    included: Mapping[str, Sequence[KnobValue]]
    fixed: Mapping[str, KnobValue]
    excluded: Mapping[str, str]

    def to_json(self) -> JsonObject:
        return {"included": {k: list(v) for k, v in self.included.items()}, "fixed": dict(self.fixed),
                "excluded": dict(self.excluded)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SpaceSummary:
        return cls(included=data.get("included") or {}, fixed=data.get("fixed") or {},
                   excluded=data.get("excluded") or {})


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunDocument:
    """best_config.json. ``schema``, ``model_file_tuned``, ``launch`` and ``outputs`` are
    added where the files are written (``autotune.emit.outputs.write_outputs``); a document read
    back from the folder carries them."""

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
    environment: Mapping[str, str]
    ablation: Ablation | None = None
    stages: VerificationStages | None = None  # how verification's stages ran, and what --timeout shortened
    plan: PlanPrediction | None = None  # None: no run was planned (--train-steps, --epochs)
    memory: MemoryFit | None = None  # None: a document from before memory was measured
    batch: BatchChoice | None = None  # None: a document from before the batch was judged
    step_profile: StepProfile | None = None  # None: not profiled (--no-profile, or it failed)
    steering: Steering | None = None  # None: the search profiled no leader
    utilisation: Utilisation | None = None  # None: no FLOPs counted (or a document from before)
    # Nothing verified, and a candidate faster by its standalone pairs' median: named, not emitted
    kept: Kept | None = None
    # The options the run was given (autotune.document.options.options_record); None: a
    # document from before they were recorded.
    options: Mapping[str, JsonValue] | None = None
    schema: int | None = None
    model_file_tuned: str | None = None
    launch: str | None = None
    outputs: Mapping[str, str] | None = None

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

    def to_json(self) -> JsonObject:
        return {
            **optional_fields(schema=self.schema),
            "model_file": self.model_file, "autotune_version": self.autotune_version,
            "fingerprint": dict(self.fingerprint), "config": self.config.to_dict(),
            "baseline": self.baseline.to_json(), "verified": self.verified,
            "best": self.best.to_json() if self.best else None,
            "speedup": self.speedup.to_json() if self.speedup else None,
            "verification": {name: c.to_json() for name, c in self.verification.items()},
            "precision": self.precision.to_json(), "rejected": json_list(self.rejected),
            "candidates": json_list(self.candidates), "search": self.search.to_json(),
            "space": self.space.to_json(),
            "layout_effect": self.layout_effect.to_json() if self.layout_effect else None,
            **optional_fields(ablation=self.ablation.to_json() if self.ablation else None,
                              plan=self.plan.to_json() if self.plan else None,
                              memory=self.memory.to_json() if self.memory else None,
                              batch=self.batch.to_json() if self.batch else None,
                              step_profile=self.step_profile.to_json() if self.step_profile else None,
                              steering=self.steering.to_json() if self.steering else None,
                              utilisation=self.utilisation.to_json() if self.utilisation else None,
                              kept=self.kept.to_json() if self.kept else None),
            **optional_fields(verification_stages=self.stages.to_json() if self.stages else None),
            "environment": dict(self.environment),
            **optional_fields(options=None if self.options is None else dict(self.options)),
            **optional_fields(model_file_tuned=self.model_file_tuned, launch=self.launch,
                        outputs=None if self.outputs is None else dict(self.outputs)),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RunDocument:
        """A document as ``to_json`` (or ``emit.write_outputs``) wrote it."""
        effect, ablation, plan = data.get("layout_effect"), data.get("ablation"), data.get("plan")
        return cls(
            model_file=data["model_file"], autotune_version=data["autotune_version"],
            fingerprint=data["fingerprint"], config=TrialConfig.from_dict(data["config"]),
            baseline=Baseline.from_json(data["baseline"]),
            best=Best.from_json(data["best"]) if data.get("best") else None,
            speedup=VerifiedSpeedup.from_json(data["speedup"]) if data.get("speedup") else None,
            verification={n: Check.from_json(c) for n, c in data["verification"].items()},
            precision=PrecisionNote.from_json(data["precision"]),
            rejected=tuple(Rejection.from_json(r) for r in data["rejected"]),
            candidates=tuple(CandidateOutcome.from_json(c) for c in data["candidates"]),
            search=SearchSummary.from_json(data["search"]), space=SpaceSummary.from_json(data["space"]),
            layout_effect=LayoutEffect.from_json(effect) if effect else None,
            environment=data["environment"],
            ablation=Ablation.from_json(ablation) if ablation else None,
            plan=PlanPrediction.from_json(plan) if plan else None,
            memory=MemoryFit.from_json(data["memory"]) if data.get("memory") else None,
            batch=BatchChoice.from_json(data["batch"]) if data.get("batch") else None,
            step_profile=StepProfile.from_json(data["step_profile"]) if data.get("step_profile") else None,
            steering=Steering.from_json(data["steering"]) if data.get("steering") else None,
            utilisation=Utilisation.from_json(data["utilisation"]) if data.get("utilisation") else None,
            kept=Kept.from_json(data["kept"]) if data.get("kept") else None,
            stages=(VerificationStages.from_json(data["verification_stages"])
                    if data.get("verification_stages") else None),
            options=data.get("options"),
            schema=data.get("schema"), model_file_tuned=data.get("model_file_tuned"),
            launch=data.get("launch"), outputs=data.get("outputs"))


@dataclasses.dataclass(frozen=True, kw_only=True)
class CandidateDocument:
    """best_config.json beside the scripts of a configuration that a verification runs (not
    a run's result): which configuration they train, and where the files are, as
    ``autotune.emit.outputs.write_candidate`` wrote them."""

    config: TrialConfig
    model_file: str
    model_file_tuned: str
    launch: str
    outputs: Mapping[str, str]
    schema: int

    def to_json(self) -> JsonObject:
        return {"schema": self.schema, "candidate": self.config.to_dict(), "model_file": self.model_file,
                "model_file_tuned": self.model_file_tuned, "launch": self.launch,
                "outputs": dict(self.outputs)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CandidateDocument:
        return cls(config=TrialConfig.from_dict(data["candidate"]), model_file=data["model_file"],
                   model_file_tuned=data["model_file_tuned"], launch=data["launch"],
                   outputs=data["outputs"], schema=data["schema"])
