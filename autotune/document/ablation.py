"""The ablation's part of a run's document: each knob's worth, the path from the baseline one
knob at a time, and the simplified configuration."""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Annotated, Any, ClassVar

from pydantic import Field
from pydantic.json_schema import JsonSchemaValue

from autotune.config import KnobValue
from autotune.document.interval import Inline, Interval
from autotune.runtime.json_value import JsonObject
from autotune.schemas.typed import HandWritten, Omitted, Record


@dataclasses.dataclass(frozen=True, kw_only=True)
class KnobEffect(Inline, Record):
    """One knob's worth to the winner: the winner's speed over the winner with that knob at
    the baseline's value (``effect``; None where that variant could not be measured)."""

    knob: str
    baseline: KnobValue
    winner: KnobValue
    kept: bool
    note: str
    effect: Interval | None = None
    rounds: Omitted[int] = None  # the rounds its effect rests on (it stops once settled)


@dataclasses.dataclass(frozen=True, kw_only=True)
class PathStep(Inline, Record):
    """Knobs added on the path from the baseline, and the speed they added given the
    knobs before them."""

    knobs: tuple[str, ...]
    baseline: tuple[KnobValue, ...]
    winner: tuple[KnobValue, ...]
    kept: bool
    effect: Interval
    rounds: int


@dataclasses.dataclass(frozen=True, kw_only=True)
class AblationPath(HandWritten):
    """The path from the baseline to the winner; ``total`` (the winner over the baseline)
    is what the steps multiply to. ``skipped``: why it was not measured (then nothing else)."""

    steps: tuple[PathStep, ...] = ()
    total: Interval | None = None
    rounds: int = 0
    kept_product: float = 1.0
    skipped: str | None = None

    JSON_SCHEMA: ClassVar[JsonSchemaValue] = {"anyOf": [
        {"type": "object", "additionalProperties": False, "required": ["skipped"],
         "properties": {"skipped": {"type": ["string", "null"]}}},
        {"type": "object", "additionalProperties": False,
         "required": ["steps", "total", "ci_low", "ci_high", "ci_level", "rounds", "kept_product"],
         "properties": {"steps": {"type": "array", "items": {"type": "object"}}, "total": {"type": "number"},
                        "ci_low": {"type": "number"}, "ci_high": {"type": "number"},
                        "ci_level": {"type": "number", "minimum": 0, "maximum": 1},
                        "rounds": {"type": "integer"}, "kept_product": {"type": "number"}}}]}

    def to_json(self) -> JsonObject:
        if self.skipped is not None or self.total is None:
            return {"skipped": self.skipped}
        return {"steps": [s.to_json() for s in self.steps], **self.total.to_json(centre="total"),
                "rounds": self.rounds, "kept_product": self.kept_product}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> AblationPath:
        if "skipped" in data:
            return cls(skipped=data["skipped"])
        return cls(steps=tuple(PathStep.from_json(s) for s in data["steps"]),
                   total=dataclasses.replace(Interval.from_json(data, centre="total"), rounds=None),
                   rounds=data["rounds"], kept_product=data["kept_product"])


@dataclasses.dataclass(frozen=True, kw_only=True)
class Simplified(Record):
    """The winner less the knobs worth nothing measurable: ``dropped`` from ``from_``;
    ``rejected`` says why it was not emitted, when it was not."""

    config: str
    dropped: Omitted[tuple[str, ...]] = None
    from_: Annotated[Omitted[str], Field(alias="from")] = None
    rejected: Omitted[str] = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Ablation(Record):
    """Why the winner won (``autotune.verify.ablation``): each knob's worth, the path from the
    baseline, and the simplified configuration; ``skipped`` when it could not be measured."""

    knobs: tuple[KnobEffect, ...] = ()
    rounds: Omitted[int] = None  # the session's rounds
    cap: Omitted[int] = None  # the most it would have run
    stopped: Omitted[str] = None  # why it ended before its cap
    winner_samples_per_s: Omitted[float] = None
    product: Omitted[float] = None  # the kept knobs' leave-one-out ratios multiplied
    path: Omitted[AblationPath] = None
    simplified: Omitted[Simplified] = None
    skipped: Omitted[str] = None
