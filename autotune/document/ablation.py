"""The ablation's part of a run's document: each knob's worth, the path from the baseline one
knob at a time, and the simplified configuration."""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from autotune.config import KnobValue
from autotune.document.interval import Centre, Interval
from autotune.document.measures import optional_fields
from autotune.runtime.json_value import JsonObject


@dataclasses.dataclass(frozen=True, kw_only=True)
class KnobEffect:
    """One knob's worth to the winner: the winner's speed over the winner with that knob at
    the baseline's value (``effect``; None where that variant could not be measured)."""

    knob: str
    baseline: KnobValue
    winner: KnobValue
    kept: bool
    note: str
    effect: Interval | None = None
    rounds: int | None = None  # the rounds its effect rests on (it stops once settled)

    def to_json(self) -> JsonObject:
        return {"knob": self.knob, "baseline": self.baseline, "winner": self.winner,
                **(self.effect.to_json(centre="ratio") if self.effect else {}), "kept": self.kept,
                "note": self.note, **optional_fields(rounds=self.rounds)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> KnobEffect:
        return cls(knob=data["knob"], baseline=data["baseline"], winner=data["winner"],
                   kept=data["kept"], note=data["note"],
                   effect=_effect(data) if "ratio" in data else None,
                   rounds=data.get("rounds"))


@dataclasses.dataclass(frozen=True, kw_only=True)
class PathStep:
    """Knobs added on the path from the baseline, and the speed they added given the
    knobs before them."""

    knobs: tuple[str, ...]
    baseline: tuple[KnobValue, ...]
    winner: tuple[KnobValue, ...]
    kept: bool
    effect: Interval
    rounds: int

    def to_json(self) -> JsonObject:
        return {"knobs": list(self.knobs), "baseline": list(self.baseline),
                "winner": list(self.winner), "kept": self.kept, **self.effect.to_json(centre="ratio"),
                "rounds": self.rounds}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PathStep:
        return cls(knobs=tuple(data["knobs"]), baseline=tuple(data["baseline"]),
                   winner=tuple(data["winner"]), kept=data["kept"], effect=_effect(data),
                   rounds=data["rounds"])


@dataclasses.dataclass(frozen=True, kw_only=True)
class AblationPath:
    """The path from the baseline to the winner; ``total`` (the winner over the baseline)
    is what the steps multiply to. ``skipped``: why it was not measured (then nothing else)."""

    steps: tuple[PathStep, ...] = ()
    total: Interval | None = None
    rounds: int = 0
    kept_product: float = 1.0
    skipped: str | None = None

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
                   total=_effect(data, centre="total"),
                   rounds=data["rounds"], kept_product=data["kept_product"])


@dataclasses.dataclass(frozen=True, kw_only=True)
class Simplified:
    """The winner less the knobs worth nothing measurable: ``dropped`` from ``from_``;
    ``rejected`` says why it was not emitted, when it was not."""

    config: str
    dropped: tuple[str, ...] | None = None
    from_: str | None = None
    rejected: str | None = None

    def to_json(self) -> JsonObject:
        return {"config": self.config,
                **optional_fields(dropped=None if self.dropped is None else list(self.dropped),
                            rejected=self.rejected),
                **optional_fields(**{"from": self.from_})}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Simplified:
        dropped = data.get("dropped")
        return cls(config=data["config"], dropped=None if dropped is None else tuple(dropped),
                   from_=data.get("from"), rejected=data.get("rejected"))


@dataclasses.dataclass(frozen=True, kw_only=True)
class Ablation:
    """Why the winner won (``autotune.verify.ablation``): each knob's worth, the path from the
    baseline, and the simplified configuration; ``skipped`` when it could not be measured."""

    knobs: tuple[KnobEffect, ...] = ()
    rounds: int | None = None  # the session's rounds
    cap: int | None = None  # the most it would have run
    stopped: str | None = None  # why it ended before its cap
    winner_samples_per_s: float | None = None
    product: float | None = None  # the kept knobs' leave-one-out ratios multiplied
    path: AblationPath | None = None
    simplified: Simplified | None = None
    skipped: str | None = None

    def to_json(self) -> JsonObject:
        return {"knobs": [k.to_json() for k in self.knobs],
                **optional_fields(rounds=self.rounds, cap=self.cap, stopped=self.stopped,
                                  winner_samples_per_s=self.winner_samples_per_s,
                                  product=self.product,
                                  path=self.path.to_json() if self.path else None,
                                  simplified=self.simplified.to_json() if self.simplified else None,
                                  skipped=self.skipped)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Ablation:
        return cls(knobs=tuple(KnobEffect.from_json(k) for k in data["knobs"]),
                   rounds=data.get("rounds"), cap=data.get("cap"), stopped=data.get("stopped"),
                   winner_samples_per_s=data.get("winner_samples_per_s"),
                   product=data.get("product"),
                   path=AblationPath.from_json(data["path"]) if "path" in data else None,
                   simplified=(Simplified.from_json(data["simplified"])
                               if "simplified" in data else None),
                   skipped=data.get("skipped"))


def _effect(data: Mapping[str, Any], *, centre: Centre = "ratio") -> Interval:
    """An effect as its part writes it: the rounds it rests on are the part's, beside it."""
    return dataclasses.replace(Interval.from_json(data, centre=centre), rounds=None)
