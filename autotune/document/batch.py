"""How the emitted global batch was chosen and judged (best_config.json's ``batch``): the
range searched and what set it, the batch check of the emitted batch where it is not the
user's, the batches that check rejected, and, without evaluate(), a larger batch the
machine ran faster that nothing could check."""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from autotune.runtime.json_value import JsonValue
from autotune.schemas.typed import Record


@dataclasses.dataclass(frozen=True, kw_only=True)
class BatchChoice(Record):
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
