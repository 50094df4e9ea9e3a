"""What a trial's result is worth to the search: the value the study ranks it by, and
whether it counts at all (a rank that held more memory than allowed does not)."""
from __future__ import annotations

import dataclasses

from autotune.config import TrialConfig
from autotune.runtime.json_value import JsonObject
from autotune.search.memory import MemoryLimit
from autotune.search.trial_summary import TrialSummary
from autotune.task.objective import PlannedRun
from autotune.trials.protocol import Failure, Status
from autotune.trials.runner import TrialResult


@dataclasses.dataclass(frozen=True)
class Scoring:
    """``plan``: the run the user plans, whose predicted time ranks the trials as an
    effective throughput (``task.objective``), None for steady throughput;
    ``memory_limit``: what a rank may hold (a trial over it is failed as out of memory: it
    is not chosen, and is retried holding less)."""

    plan: PlannedRun | None = None
    memory_limit: MemoryLimit | None = None

    def score(self, cfg: TrialConfig, result: TrialResult) -> tuple[JsonObject, float | None, float | None]:
        """``result``'s summary as the study stores it (``planned_s`` under a plan), the
        value it ranks by and the planned run's predicted time (None without a plan or a
        value); a result over the memory limit is marked failed first, in place."""
        if (result.status == Status.OK and self.memory_limit is not None
                and (over := self.memory_limit.over(cfg, TrialSummary.from_json(result.summary())))):
            result.status, result.failure, result.message = Status.FAILED, Failure.OUT_OF_MEMORY, over
        summary = result.summary()
        value, planned_s = result.value, None
        if self.plan is not None and value:
            # the planned run's predicted time ranks it, as an effective throughput
            planned_s = self.plan.predicted_s(samples_per_s=value, one_time_s=result.one_time_s)
            summary["planned_s"] = planned_s
            value = self.plan.samples / planned_s
        return summary, value, planned_s

    def planned(self, *, best: float | None, planned_s: float | None,
                one_time_s: float | None) -> dict[str, float | None]:
        """What the progress shows of the planned run: the best trial's predicted time, and
        this one's (None without a plan; ``planned_s`` None: not measured to the end)."""
        if self.plan is None:
            return {}
        shown: dict[str, float | None] = {"best_planned_s": self.plan.samples / best if best else None}
        if planned_s is not None:
            shown.update(planned_s=planned_s, one_time_s=one_time_s)
        return shown
