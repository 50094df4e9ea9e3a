"""The planned run's part of a run's document (``"plan"`` in best_config.json), present when
the user gave ``--train-steps`` or ``--epochs``: the plan, the predicted wall time of the
baseline and of the emitted configuration, and each compiled configuration's break-even
(``autotune.task.objective``)."""
from __future__ import annotations

import dataclasses
from typing import ClassVar

from pydantic import computed_field

from autotune.config import TrialConfig
from autotune.schemas.typed import Flattened, Record
from autotune.task.objective import BreakEven, PlannedRun, Pricing, break_evens


@dataclasses.dataclass(frozen=True, kw_only=True)
class Predicted(Record):
    """One configuration over the planned run: its one-time cost (the search's measurement),
    its steady rate (the standalone runs' where verified) and the predicted wall time."""

    one_time_s: float
    samples_per_s: float
    predicted_s: float


@dataclasses.dataclass(frozen=True, kw_only=True)
class PlanPrediction(Flattened, Record):
    plan: PlannedRun
    baseline: Predicted
    chosen: Predicted
    break_even: tuple[BreakEven, ...]

    FLAT: ClassVar[str] = "plan"

    @computed_field  # type: ignore[prop-decorator]
    @property
    def description(self) -> str:
        return self.plan.describe()

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
