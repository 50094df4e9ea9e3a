"""What an emitted script's run reports (``train_tuned.py --report``, read back by
``runner.run_launcher``): the training loop's (``runtime.loop``) throughput and memory, or
the profiled run's (``runtime.profile``) step profile."""
from __future__ import annotations

import dataclasses

from autotune.runtime.json_value import JsonObject
from autotune.schemas.typed import Record


@dataclasses.dataclass
class ScriptReport(Record):
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
