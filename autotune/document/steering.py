"""Which step profile led to which trial, and what each found (best_config.json's
``steering``): the search profiles its leader once the start has run and tries what the
profile says (``search.steering``)."""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from autotune.runtime.json_value import JsonObject
from autotune.runtime.step_profile import StepProfile


@dataclasses.dataclass(frozen=True, kw_only=True)
class SteeredTrial:
    """A trial a profile asked for: its configuration (short), the profile's category and
    why, and its rate (None where it did not finish: ``outcome`` says why)."""

    config: str
    category: str
    why: str
    samples_per_s: float | None
    outcome: str

    def to_json(self) -> JsonObject:
        return {"config": self.config, "category": self.category, "why": self.why,
                "samples_per_s": self.samples_per_s, "outcome": self.outcome}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SteeredTrial:
        rate = data.get("samples_per_s")
        return cls(config=str(data["config"]), category=str(data["category"]), why=str(data["why"]),
                   samples_per_s=None if rate is None else float(rate), outcome=str(data["outcome"]))


@dataclasses.dataclass(frozen=True, kw_only=True)
class SteeringRound:
    """One profile of the leader (``config``, short; its rate in the search), where its
    step went (None where the profiled run failed: ``failed``), and the trials it led to."""

    config: str
    samples_per_s: float | None
    profile: StepProfile | None
    failed: str | None
    trials: tuple[SteeredTrial, ...]

    def to_json(self) -> JsonObject:
        return {"config": self.config, "samples_per_s": self.samples_per_s,
                "profile": self.profile.to_json() if self.profile else None, "failed": self.failed,
                "trials": [t.to_json() for t in self.trials]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SteeringRound:
        rate = data.get("samples_per_s")
        return cls(config=str(data["config"]), samples_per_s=None if rate is None else float(rate),
                   profile=StepProfile.from_json(data["profile"]) if data.get("profile") else None,
                   failed=data.get("failed"), trials=tuple(SteeredTrial.from_json(t) for t in data.get("trials") or ()))

    def lines(self) -> list[str]:
        if self.profile is None:
            return [f"  profiled the leader ({self.config}): no profile ({self.failed})"]
        top = ", ".join(f"{c.value} {share:.0%}" for c, share in self.profile.ranked()[:3])
        out = [f"  profiled the leader ({self.config}): {top}"]
        for t in self.trials:
            what = (f"{t.samples_per_s / self.samples_per_s:.2f}x the leader" if t.samples_per_s and self.samples_per_s
                    else f"{t.samples_per_s:,.0f} samples/s" if t.samples_per_s else t.outcome)
            out.append(f"    -> {t.why}: {what}")
        if not self.trials:
            out.append("    -> nothing left to try for what dominates it")
        return out


@dataclasses.dataclass(frozen=True)
class Steering:
    rounds: tuple[SteeringRound, ...]

    def lines(self) -> list[str]:
        if not self.rounds:
            return []
        return ["where the leader's step went, and what the search tried for it:",
                *(line for r in self.rounds for line in r.lines())]

    def to_json(self) -> JsonObject:
        return {"rounds": [r.to_json() for r in self.rounds]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Steering:
        return cls(tuple(SteeringRound.from_json(r) for r in data.get("rounds") or ()))
