"""Which step profile led to which trial, and what each found (best_config.json's
``steering``): the search profiles its leader once the start has run and tries what the
profile says (``search.steering``)."""
from __future__ import annotations

import dataclasses

from autotune.runtime.step_profile import StepProfile
from autotune.schemas.typed import OmittedEmpty, Record


@dataclasses.dataclass(frozen=True, kw_only=True)
class SteeredTrial(Record):
    """A trial a profile asked for: its configuration (short), the profile's category and
    why, and its rate (None where it did not finish: ``outcome`` says why)."""

    config: str
    category: str
    why: str
    samples_per_s: float | None
    outcome: str


@dataclasses.dataclass(frozen=True, kw_only=True)
class SteeringRound(Record):
    """One profile of the leader (``config``, short; its rate in the search), where its
    step went (None where the profiled run failed: ``failed``), and the trials it led to."""

    config: str
    samples_per_s: float | None
    profile: StepProfile | None
    failed: str | None
    trials: tuple[SteeredTrial, ...]
    # the changes it did not queue again, each with why (they lost for an earlier leader)
    skipped: OmittedEmpty[tuple[str, ...]] = ()

    def lines(self) -> list[str]:
        if self.profile is None:
            return [f"  profiled the leader ({self.config}): no profile ({self.failed})"]
        top = ", ".join(f"{c.value} {share:.0%}" for c, share in self.profile.ranked()[:3])
        out = [f"  profiled the leader ({self.config}): {top}"]
        for t in self.trials:
            what = (f"{t.samples_per_s / self.samples_per_s:.2f}x the leader" if t.samples_per_s and self.samples_per_s
                    else f"{t.samples_per_s:,.0f} samples/s" if t.samples_per_s else t.outcome)
            out.append(f"    -> {t.why}: {what}")
        out += [f"    -> not again: {line}" for line in self.skipped]
        if not self.trials:
            out.append("    -> nothing left to try for what dominates it")
        return out


@dataclasses.dataclass(frozen=True)
class Steering(Record):
    rounds: tuple[SteeringRound, ...]

    def lines(self) -> list[str]:
        if not self.rounds:
            return []
        return ["where the leader's step went, and what the search tried for it:",
                *(line for r in self.rounds for line in r.lines())]
