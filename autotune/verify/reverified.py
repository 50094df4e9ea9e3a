"""What re-verifying an output folder found (``again.reverify``): written to
``OUTDIR/reverify.json`` and printed by ``autotune verify``."""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from autotune.document.measures import Check, VerifiedSpeedup, optional_fields
from autotune.runtime.json_value import JsonObject


@dataclasses.dataclass(frozen=True, kw_only=True)
class Reverified:
    """Whether the configuration passed again (``reason`` says why not); the baseline's
    rate and the speedup measured now beside the one printed when it was tuned, every
    check, whether this machine's fingerprint differs, and, where the speedup now lies
    outside the printed interval, a sentence saying so. ``checks`` None: nothing was
    measured (the configuration is the baseline itself). ``kept``: where the run emitted the
    baseline, the launch.sh of the configuration it kept (``RunDocument.kept``), relative to
    the folder: that one was measured."""

    verified: bool
    reason: str | None = None
    baseline_samples_per_s: float | None = None
    speedup: VerifiedSpeedup | None = None
    printed_when_tuned: VerifiedSpeedup | None = None
    checks: Mapping[str, Check] | None = None
    fingerprint_differs: bool = False
    outside_printed_interval: str | None = None
    kept: str | None = None

    def to_json(self) -> JsonObject:
        if self.checks is None:
            return {"verified": self.verified, "reason": self.reason, **optional_fields(kept=self.kept)}
        out: JsonObject = {
            "verified": self.verified, "baseline_samples_per_s": self.baseline_samples_per_s,
            "speedup": self.speedup.headline() if self.speedup is not None else None,
            "printed_when_tuned": self.printed_when_tuned.headline() if self.printed_when_tuned is not None else None,
            "verification": {name: c.to_json() for name, c in self.checks.items()},
            "fingerprint_differs": self.fingerprint_differs}
        if not self.verified:
            out["reason"] = self.reason
        if self.outside_printed_interval:
            out["outside_printed_interval"] = self.outside_printed_interval
        if self.kept:
            out["kept"] = self.kept
        return out
