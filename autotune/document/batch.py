"""How the emitted global batch was chosen and judged (best_config.json's ``batch``): the
range searched and what set it, the batch check of the emitted batch where it is not the
user's, the batches that check rejected, and, without evaluate(), a larger batch the
machine ran faster that nothing could check."""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from autotune.runtime.json_value import JsonObject, JsonValue


@dataclasses.dataclass(frozen=True, kw_only=True)
class BatchChoice:
    """``searched``: the smallest and largest global batch the search tried; ``set_by``:
    what set that range; ``ramp``: the ramp's measurements (``search.batch_range.Ramp``
    as JSON) where it set it; ``check``: the emitted batch's batch check, in words (None:
    the user's batch, or none applied); ``trains_faster``: the emitted configuration's
    speedup, what it buys over the same samples; ``rejected``: batch -> why, for those the
    batch check rejected; ``unchecked``: a faster batch beyond what may be emitted without
    evaluate(), in words."""

    chosen: int
    user: int
    searched: tuple[int, int]
    set_by: str
    ramp: Mapping[str, JsonValue] | None = None
    check: str | None = None
    trains_faster: float | None = None
    rejected: Mapping[str, str] = dataclasses.field(default_factory=dict)
    unchecked: str | None = None

    def lines(self) -> list[str]:
        """The summary's lines."""
        lines = [f"batch: {self.chosen} (yours {self.user}); the search tried {self.searched[0]} to "
                 f"{self.searched[1]}: {self.set_by}."]
        if self.check:
            faster = (f"; the emitted configuration trains them {self.trains_faster:.2f}x as fast"
                      if self.trains_faster else "")
            lines.append(f"  {self.check}{faster}.")
        for batch, why in self.rejected.items():
            lines.append(f"  rejected batch {batch}: {why}.")
        if self.unchecked:
            lines.append(f"  {self.unchecked}.")
        return lines

    def to_json(self) -> JsonObject:
        return {"chosen": self.chosen, "user": self.user, "searched": list(self.searched), "set_by": self.set_by,
                "ramp": dict(self.ramp) if self.ramp is not None else None, "check": self.check,
                "trains_faster": self.trains_faster, "rejected": dict(self.rejected),
                "unchecked": self.unchecked}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> BatchChoice:
        return cls(chosen=data["chosen"], user=data["user"], searched=tuple(data["searched"]),
                   set_by=data["set_by"], ramp=data.get("ramp"), check=data.get("check"),
                   trains_faster=data.get("trains_faster"), rejected=data.get("rejected") or {},
                   unchecked=data.get("unchecked"))
