"""What the side-by-side speed check measured (``side_by_side.speed_check``): the
reference's rates, and each candidate's rates and ratios against it, which its check's
figures carry into the reports and best_config.json."""
from __future__ import annotations

import dataclasses
from typing import ClassVar

from autotune.config import TrialConfig
from autotune.document.interval import Centre, Inline, Interval
from autotune.document.measures import Check
from autotune.runtime.json_value import JsonObject
from autotune.schemas.typed import Omitted, Record
from autotune.task.objective import Pricing, duration


@dataclasses.dataclass(frozen=True, kw_only=True)
class ReferenceSpeed:
    """The reference's rate in each round and their median, the rounds run, the cap and why
    it ended before the cap (None where it did not). Where nothing was measured side by
    side, the search's value alone: no rounds, no cap."""

    samples_per_s: tuple[float, ...]
    median_samples_per_s: float
    rounds: int | None = None
    cap: int | None = None
    stopped: str | None = None


@dataclasses.dataclass(kw_only=True)
class CandidateSpeed(Inline, Record):
    """A candidate's side-by-side figures against the reference: its ratio per round and
    their interval, its rates, why the check stopped measuring it (None where it ran to
    the end) and, where it was not shown faster, why. Built up after the check: the
    ranking (``verdict.rank_by_rounds``) records its rate relative to the candidates'
    level and, under a planned run, the run's predicted time and its one-time cost."""

    interval: Interval
    ratios: tuple[float, ...]
    samples_per_s: tuple[float, ...]
    median_samples_per_s: float
    stopped: Omitted[str] = None
    reason: Omitted[str] = None
    relative_to_candidates: Omitted[float] = None
    planned_s: Omitted[float] = None
    one_time_s: Omitted[float] = None

    INTERVAL: ClassVar[str] = "interval"
    CENTRE: ClassVar[Centre] = "median"

    @classmethod
    def from_check(cls, check: Check) -> CandidateSpeed | None:
        """The figures of a speed check; None where the candidate failed when re-measured."""
        return cls.from_json(check.detail) if "ratios" in check.detail else None


def plan_check(pricing: Pricing, cfg: TrialConfig, speed: CandidateSpeed, *, baseline: TrialConfig,
               base_rate: float) -> Check:
    """Whether ``cfg``, faster per step than the baseline side by side (``speed``: its
    speed check's figures; ``base_rate``: the baseline's median rate beside it), is faster
    over the planned run too, once one-time costs count: compiling can save a fifth of
    every step and still lose a short run."""
    rate = speed.interval.ratio * base_rate
    mine, theirs = pricing.predicted_s(cfg, rate), pricing.predicted_s(baseline, base_rate)
    once, base_once = pricing.one_time_s(cfg), pricing.one_time_s(baseline)
    detail: JsonObject = {
        "plan": pricing.plan.describe(), "predicted_s": mine, "baseline_predicted_s": theirs,
        "one_time_s": once, "baseline_one_time_s": base_once}
    if mine < theirs:
        return Check(True, detail)
    detail["reason"] = (
        f"slower than the baseline over the planned run ({pricing.plan.describe()}): "
        f"{duration(mine)} predicted against {duration(theirs)}, its one-time cost of "
        f"{duration(once)} (the baseline's {duration(base_once)}) outweighs "
        f"{speed.interval.ratio:.2f}x the speed per step")
    return Check(False, detail)
