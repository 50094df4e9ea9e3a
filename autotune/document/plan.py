"""The planned run's part of a run's document (``"plan"`` in best_config.json), present when
the user gave ``--train-steps`` or ``--epochs``: the plan, the predicted wall time of the
baseline and of the emitted configuration, and each compiled configuration's break-even
(``autotune.task.objective``)."""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from autotune.config import TrialConfig
from autotune.runtime.json_value import JsonObject
from autotune.task.objective import BreakEven, PlannedRun, Pricing, break_evens


@dataclasses.dataclass(frozen=True, kw_only=True)
class Predicted:
    """One configuration over the planned run: its one-time cost (the search's measurement),
    its steady rate (the standalone runs' where verified) and the predicted wall time."""

    one_time_s: float
    samples_per_s: float
    predicted_s: float

    def to_json(self) -> JsonObject:
        return {"one_time_s": self.one_time_s, "samples_per_s": self.samples_per_s,
                "predicted_s": self.predicted_s}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Predicted:
        return cls(one_time_s=data["one_time_s"], samples_per_s=data["samples_per_s"],
                   predicted_s=data["predicted_s"])


@dataclasses.dataclass(frozen=True, kw_only=True)
class PlanPrediction:
    plan: PlannedRun
    baseline: Predicted
    chosen: Predicted
    break_even: tuple[BreakEven, ...]

    @classmethod
    def of(cls, pricing: Pricing, *, baseline: TrialConfig, baseline_samples_per_s: float,
           chosen: TrialConfig, chosen_samples_per_s: float) -> PlanPrediction:
        def predicted(cfg: TrialConfig, rate: float) -> Predicted:
            return Predicted(one_time_s=pricing.one_time_s(cfg), samples_per_s=rate,
                             predicted_s=pricing.predicted_s(cfg, rate))

        return cls(plan=pricing.plan, baseline=predicted(baseline, baseline_samples_per_s),
                   chosen=predicted(chosen, chosen_samples_per_s),
                   break_even=tuple(break_evens(pricing.measured)))

    def lines(self) -> list[str]:
        """The break-evens, one line each, for the summary and the report."""
        return [b.line(plan=self.plan) for b in self.break_even]

    def to_json(self) -> JsonObject:
        return {**self.plan.to_json(), "description": self.plan.describe(),
                "baseline": self.baseline.to_json(), "chosen": self.chosen.to_json(),
                "break_even": [b.to_json() for b in self.break_even]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PlanPrediction:
        return cls(plan=PlannedRun.from_json(data), baseline=Predicted.from_json(data["baseline"]),
                   chosen=Predicted.from_json(data["chosen"]),
                   break_even=tuple(BreakEven.from_json(b) for b in data["break_even"]))
