"""A trial's result as the study stores it on the trial (``StudyAttr.RESULT``), read back:
what ``TrialResult.summary`` wrote, with the planned run's time where the search ranks
by one (``Scoring.score``)."""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from autotune.runtime.json_value import JsonObject
from autotune.schemas.typed import Record


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrialSummary(Record):
    """How the trial ended (``status``, ``failure``, ``message``, ``log_tail``), its median
    window (``value``, samples/s), the windows and their spread (``values``, ``iqr``), its
    one-time cost, what its tree (``peak_rss_mb``) and its busiest rank (``rank_peak_mb``;
    on CUDA rank 0's GPU, ``cuda_peak_mb`` of ``cuda_total_mb``) held at their peak, its
    wall time and phases, whether it ran in a warm process, its losses, the first step's
    facts, the threads torch chose and the ranks, ``planned_s`` under a planned run, and the
    imports its process found done (``preimported_s``: forked from a warm interpreter).
    A study from an older autotune may lack any of them: each reads as None (or empty)."""

    status: str | None = None
    value: float | None = None
    values: tuple[float, ...] = ()
    iqr: float | None = None
    failure: str | None = None
    message: str = ""
    log_tail: str = ""
    one_time_s: float | None = None
    peak_rss_mb: float | None = None
    rank_peak_mb: float | None = None
    wall_s: float | None = None
    phases: Mapping[str, float] = dataclasses.field(default_factory=dict)
    warm: bool = False
    losses: tuple[float, ...] = ()
    facts: JsonObject = dataclasses.field(default_factory=dict)
    threads_seen: int | None = None
    world: int | None = None
    cuda_peak_mb: float | None = None
    cuda_total_mb: float | None = None
    planned_s: float | None = None
    preimported_s: float | None = None
