"""What an emitted script's run reports (``train_tuned.py --report``, read back by
``runner.run_launcher``): the training loop's (``runtime.loop``) throughput and memory, or
the profiled run's (``runtime.profile``) step profile."""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from autotune.runtime.json_value import JsonObject


@dataclasses.dataclass
class ScriptReport:
    """``samples_per_s`` over the timed steps (None: none were timed, or a stop signal
    ended the run), the busiest rank's peak in MiB, the losses, the first step's facts as
    the trials record them, the signal that stopped it; a profiled run's ``step_profile``
    (``runtime.shares.StepShares.to_json``; empty where not profiled)."""

    samples_per_s: float | None = None
    rank_peak_mb: float | None = None
    steps: int | None = None
    first_step: int | None = None
    timed_steps: int | None = None
    losses: list[float] = dataclasses.field(default_factory=list)
    facts: JsonObject | None = None
    stopped_by: int | None = None
    step_profile: JsonObject = dataclasses.field(default_factory=dict)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ScriptReport:
        rate, peak = data.get("samples_per_s"), data.get("rank_peak_mb")
        return cls(samples_per_s=float(rate) if rate is not None else None,
                   rank_peak_mb=float(peak) if peak is not None else None,
                   steps=data.get("steps"), first_step=data.get("first_step"), timed_steps=data.get("timed_steps"),
                   losses=list(data.get("losses") or []), facts=data.get("facts"), stopped_by=data.get("stopped_by"),
                   step_profile=dict(data.get("step_profile") or {}))
