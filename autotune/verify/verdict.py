"""A candidate's verdict: its checks, its side-by-side speed, its ablation; and the
candidates ranked by what verification measured of them."""
from __future__ import annotations

import dataclasses
import math
from typing import Any

from autotune.config import TrialConfig
from autotune.document.ablation import Ablation
from autotune.document.measures import CandidateOutcome, Check, Standalone
from autotune.search.objective import Pricing
from autotune.verify.side_by_side import relative_to_level


@dataclasses.dataclass
class Verdict:
    config: TrialConfig
    checks: dict[str, Check]
    speed: dict[str, Any]
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
    measured = [v for v in verdicts if v.speed.get("samples_per_s")]
    if not measured:
        return list(verdicts)
    stopped = [v for v in measured if v.speed.get("stopped")]
    to_the_end = [v for v in measured if v not in stopped] or stopped
    beside = [v for v in stopped if v not in to_the_end]
    relative = relative_to_level([v.speed["samples_per_s"] for v in to_the_end],
                                 beside=[v.speed["samples_per_s"] for v in beside])
    for v, r in zip([*to_the_end, *beside], relative):
        v.speed["relative_to_candidates"] = r
    if pricing is not None:  # search.objective: compiling's one-time cost counts
        pricing.price([(v.config, v.speed) for v in measured])
        return sorted(verdicts, key=lambda v: v.speed.get("planned_s", math.inf))
    return sorted(verdicts, key=lambda v: (v in to_the_end, v.speed.get("relative_to_candidates", 0.0)),
                  reverse=True)


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
        out.append(CandidateOutcome(
            config=v.config, speed={k: v.speed.get(k) for k in CandidateOutcome.SPEED_KEYS},
            checks=tuple(sorted(v.checks)), outcome=outcome))
    return out
