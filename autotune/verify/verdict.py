"""A candidate's verdict: its checks, its side-by-side speed, its ablation; and the
candidates ranked by what verification measured of them."""
from __future__ import annotations

import dataclasses
import math

from autotune.config import TrialConfig
from autotune.document.ablation import Ablation
from autotune.document.measures import CandidateOutcome, Check, Standalone
from autotune.task.objective import Pricing
from autotune.verify.side_by_side import relative_to_level
from autotune.verify.speed import CandidateSpeed


@dataclasses.dataclass
class Verdict:
    config: TrialConfig
    checks: dict[str, Check]
    speed: CandidateSpeed | None = None  # its side-by-side figures, once the speed check measured it
    ablation: Ablation | None = None  # the knob-by-knob measurement that shaped it

    @property
    def passed(self) -> bool:
        return all(c.passed is not False for c in self.checks.values())

    @property
    def reason(self) -> str:
        return "; ".join(f"{name}: {c.detail.get('reason', 'failed')}"
                         for name, c in self.checks.items() if c.passed is False)

    @property
    def standalone(self) -> Standalone | None:
        """The standalone pairs' figures (what is printed), once they ran."""
        return Standalone.from_check(self.checks.get("standalone"))


def rank_by_rounds(verdicts: list[Verdict], pricing: Pricing | None = None) -> list[Verdict]:
    """Fastest first, judged round by round against the candidates' own level
    (``side_by_side.relative_to_level``), not against the baseline's window. Those the
    speed check stopped as clearly slower than the leader are judged against the same
    level in their rounds and come after the ones it measured to the end; those whose
    re-measurement failed last. With a planned run (``pricing``), shortest predicted run
    first: the same rates, and each one's one-time cost from the search."""
    speeds = [(v, v.speed) for v in verdicts if v.speed is not None and v.speed.samples_per_s]
    if not speeds:
        return list(verdicts)
    stopped = [(v, s) for v, s in speeds if s.stopped]
    to_the_end = [(v, s) for v, s in speeds if (v, s) not in stopped] or stopped
    beside = [(v, s) for v, s in stopped if (v, s) not in to_the_end]
    ordered = [*to_the_end, *beside]
    relative = relative_to_level([s.samples_per_s for _, s in to_the_end],
                                 beside=[s.samples_per_s for _, s in beside])
    for (_, s), r in zip(ordered, relative):
        s.relative_to_candidates = r
    if pricing is not None:  # task.objective: compiling's one-time cost counts
        priced = pricing.price([(v.config, s.samples_per_s, r) for (v, s), r in zip(ordered, relative)])
        for (_, s), (planned_s, one_time_s) in zip(ordered, priced):
            s.planned_s, s.one_time_s = planned_s, one_time_s
    for v, s in ordered:  # the speed check's figures carry the ranking's
        if "speed" in v.checks:
            v.checks["speed"] = Check(v.checks["speed"].passed, s.to_json())
    if pricing is not None:
        return sorted(verdicts, key=_planned_s)
    ends = [v for v, _ in to_the_end]
    return sorted(verdicts, key=lambda v: (v in ends, _relative(v)), reverse=True)


def _planned_s(v: Verdict) -> float:
    return v.speed.planned_s if v.speed is not None and v.speed.planned_s is not None else math.inf


def _relative(v: Verdict) -> float:
    speed = v.speed
    return speed.relative_to_candidates if speed is not None and speed.relative_to_candidates is not None else 0.0


def outcomes(verdicts: list[Verdict], winner: Verdict | None,
             pricing: Pricing | None = None) -> list[CandidateOutcome]:
    """Every candidate's re-measured speed and what became of it, in the order they were
    tried: with the passed-but-not-chosen ones kept, the verification order can be
    audited afterwards (which candidate a different order would have emitted)."""
    out = []
    for v in rank_by_rounds(verdicts, pricing):
        if v is winner:
            outcome = "emitted"
        elif not v.passed:
            outcome = f"rejected: {v.reason}"
        elif winner is not None:  # verification stops at the first to pass them all
            outcome = "faster than the baseline; not checked further, one tried earlier was emitted"
        else:
            outcome = ("faster side by side; its script was not run alone (verification runs "
                       "the scripts of the fastest few only)")
        interval = v.speed.interval if v.speed is not None else None
        out.append(CandidateOutcome(
            config=v.config, median=interval.ratio if interval else None,
            ci_low=interval.low if interval else None, ci_high=interval.high if interval else None,
            relative_to_candidates=v.speed.relative_to_candidates if v.speed is not None else None,
            checks=tuple(sorted(v.checks)), outcome=outcome))
    return out
