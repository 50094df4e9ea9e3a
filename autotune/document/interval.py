"""The interval: a ratio of two speeds (a median over rounds or pairs, or a geometric mean)
and the range ``low``-``high`` that holds it, or a re-run's, with probability ``level``.

One type for every interval a run reports. best_config.json keeps the keys its parts have
always had, so that a user's tooling reads it as before: ``median`` or ``ratio`` for the
centre beside ``ci_low``, ``ci_high``, ``ci_level`` (and ``rounds`` where counted); a
median's own interval as ``low``, ``high``, ``level``. Either spelling reads back."""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar, Literal

from pydantic import GetJsonSchemaHandler, SerializerFunctionWrapHandler, model_serializer, model_validator
from pydantic.json_schema import JsonSchemaValue

from autotune.runtime.json_value import JsonObject
from autotune.schemas.typed import HandWritten, fields_schema

Centre = Literal["median", "ratio", "total"]  # "total": the ablation path's


@dataclasses.dataclass(frozen=True, kw_only=True)
class Interval(HandWritten):
    ratio: float
    low: float
    high: float
    level: float
    rounds: int | None = None  # the rounds or pairs it is over, where it counts them

    JSON_SCHEMA: ClassVar[JsonSchemaValue] = {
        "type": "object", "additionalProperties": False, "required": ["median", "ci_low", "ci_high", "ci_level"],
        "properties": {"median": {"type": "number"}, "ci_low": {"type": "number"}, "ci_high": {"type": "number"},
                       "ci_level": {"type": "number", "minimum": 0, "maximum": 1}, "rounds": {"type": "integer"}}}

    def to_json(self, *, centre: Centre = "median") -> JsonObject:
        """The keys of a check's figures: ``centre``, ``ci_low``, ``ci_high``, ``ci_level``
        (and ``rounds``), in that order."""
        counted: JsonObject = {} if self.rounds is None else {"rounds": self.rounds}
        return {centre: self.ratio, "ci_low": self.low, "ci_high": self.high, "ci_level": self.level, **counted}

    def bounds_json(self) -> JsonObject:
        """Its ends alone, where the centre is written beside it: ``low``, ``high``, ``level``."""
        return {"low": self.low, "high": self.high, "level": self.level}

    @classmethod
    def from_json(cls, data: Mapping[str, Any], *, centre: Centre = "median") -> Interval:
        """Either spelling: ``ci_low``/``ci_high``/``ci_level`` or ``low``/``high``/``level``;
        the centre under ``centre``, else under the other name."""
        other = "ratio" if centre != "ratio" else "median"
        rounds = data.get("rounds")
        return cls(ratio=data[centre] if centre in data else data[other],
                   low=data["ci_low"] if "ci_low" in data else data["low"],
                   high=data["ci_high"] if "ci_high" in data else data["high"],
                   level=data["ci_level"] if "ci_level" in data else data["level"],
                   rounds=None if rounds is None else int(rounds))

    @classmethod
    def around(cls, ratio: float, bounds: Mapping[str, Any]) -> Interval:
        """``ratio`` with the ends written apart from it (``bounds_json``)."""
        return cls(ratio=ratio, low=bounds["low"], high=bounds["high"], level=bounds["level"])


# An interval's ends alone (``Interval.bounds_json``), where its centre is written beside it.
BOUNDS_SCHEMA: JsonSchemaValue = {
    "type": "object", "additionalProperties": False, "required": ["low", "high", "level"],
    "properties": {"low": {"type": "number"}, "high": {"type": "number"},
                   "level": {"type": "number", "minimum": 0, "maximum": 1}}}


class Inline:
    """A dataclass read and written by pydantic (``autotune.schemas.typed.Record``) whose
    interval, the field ``INTERVAL``, is written as its own keys (``CENTRE``, ``ci_low``, ...)
    among the part's: the shape best_config.json has always had. Where the part counts
    its own ``rounds``, the interval's are the part's."""

    INTERVAL: ClassVar[str] = "effect"
    CENTRE: ClassVar[Centre] = "ratio"

    @model_serializer(mode="wrap")
    def _inline(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # dict[str, Any], not JsonObject: pydantic reads this annotation, and the recursive
        # alias does not resolve outside its module
        out: dict[str, Any] = handler(self)
        out.pop(self.INTERVAL, None)
        interval: Interval | None = getattr(self, self.INTERVAL)
        return out if interval is None else {**interval.to_json(centre=self.CENTRE), **out}

    @classmethod
    def __get_pydantic_json_schema__(cls, core: Any, handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        own = fields_schema(core, handler)
        field = own["properties"].pop(cls.INTERVAL)
        optional = {"type": "null"} in field.get("anyOf", [])  # None: no interval, no keys
        keys = {cls.CENTRE: {"type": "number"}, "ci_low": {"type": "number"}, "ci_high": {"type": "number"},
                "ci_level": {"type": "number", "minimum": 0, "maximum": 1}}
        own["properties"] = {**keys, "rounds": {"type": "integer"}, **own["properties"]}
        required = set(own.get("required", []))
        required.discard(cls.INTERVAL)
        if not optional:  # an interval it always has
            required |= set(keys)
        own["required"] = sorted(required)
        return own

    @model_validator(mode="before")
    @classmethod
    def _gather(cls, data: Any) -> Any:
        if not isinstance(data, Mapping) or "ci_low" not in data:  # no interval written
            return data
        interval = Interval.from_json(data, centre=cls.CENTRE)
        if "rounds" in {f.name for f in dataclasses.fields(cls)}:  # type: ignore[arg-type]
            interval = dataclasses.replace(interval, rounds=None)
        return {**data, cls.INTERVAL: interval}
