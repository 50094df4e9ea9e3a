"""The interval: a ratio of two speeds (a median over rounds or pairs, or a geometric mean)
and the range ``low``-``high`` that holds it, or a re-run's, with probability ``level``.

One type for every interval a run reports. best_config.json keeps the keys its parts have
always had, so that a user's tooling reads it as before: ``median`` or ``ratio`` for the
centre beside ``ci_low``, ``ci_high``, ``ci_level`` (and ``rounds`` where counted); a
median's own interval as ``low``, ``high``, ``level``. Either spelling reads back."""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Literal

from autotune.runtime.json_value import JsonObject

Centre = Literal["median", "ratio", "total"]  # "total": the ablation path's


@dataclasses.dataclass(frozen=True, kw_only=True)
class Interval:
    ratio: float
    low: float
    high: float
    level: float
    rounds: int | None = None  # the rounds or pairs it is over, where it counts them

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
