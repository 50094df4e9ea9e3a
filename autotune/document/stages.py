"""How verification's stages ran: each one's rounds (or pairs) against its cap, why it
stopped before the cap (``autotune.verify.sequential``) and what ``--timeout`` shortened
(``autotune.verify.fit``): ``verification_stages`` in best_config.json, and the lines
the summary prints about them."""
from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from typing import Any

from autotune.document.measures import optional_fields
from autotune.runtime.json_value import JsonObject


class Stage(str, enum.Enum):
    GATES = "gates"
    SPEED = "speed"
    ABLATION = "ablation"
    STANDALONE = "standalone"

    @property
    def named(self) -> str:
        return {Stage.GATES: "numerics and quality gates", Stage.SPEED: "speed check",
                Stage.ABLATION: "ablation", Stage.STANDALONE: "standalone pairs"}[self]

    @property
    def unit(self) -> str:
        return "pairs" if self is Stage.STANDALONE else "rounds"


@dataclasses.dataclass(frozen=True, kw_only=True)
class StageRecord:
    """One stage: ``ran`` of ``cap`` rounds (pairs for the standalone stage; None where it
    did not run); ``stopped``: why it ended before its cap; ``dropped``: what it stopped
    measuring before its end, and why; ``shortened``: what --timeout changed, and how;
    ``config``: the candidate it measured, where it measures one."""

    stage: Stage
    ran: int | None = None
    cap: int | None = None
    stopped: str | None = None
    dropped: str | None = None
    shortened: str | None = None
    config: str | None = None

    @property
    def remarkable(self) -> bool:
        """Whether it ran otherwise than asked: the summary says so."""
        return bool(self.stopped or self.dropped or self.shortened)

    def line(self) -> str:
        """What the summary prints, e.g. "standalone pairs: stopped after 5 of 6, not faster
        alone, settled after 5 pairs: 0.80x (94% interval 0.78-0.83x)"."""
        head = self.stage.named + (f" of {self.config}" if self.config else "")
        if self.ran is None:
            return f"{head}: {self.shortened or self.stopped or 'not run'}"
        parts = [f"stopped after {self.ran} of {self.cap}, {self.stopped}" if self.stopped
                 else f"{self.ran} of {self.cap} {self.stage.unit}"]
        parts += [p for p in (self.dropped, self.shortened) if p]
        return f"{head}: " + "; ".join(parts)

    def to_json(self) -> JsonObject:
        return {"stage": self.stage.value,
                **optional_fields(ran=self.ran, cap=self.cap, stopped=self.stopped, dropped=self.dropped,
                                  shortened=self.shortened, config=self.config),
                "note": self.line()}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StageRecord:
        return cls(stage=Stage(data["stage"]), ran=data.get("ran"), cap=data.get("cap"),
                   stopped=data.get("stopped"), dropped=data.get("dropped"),
                   shortened=data.get("shortened"), config=data.get("config"))


@dataclasses.dataclass(frozen=True, kw_only=True)
class VerificationStages:
    """Every stage's record, in the order they ran; with ``--timeout``, the seconds it
    left verification (``left_s``), what the fitted stages were estimated to take
    (``estimate_s``), and ``over`` where even their minimum did not fit."""

    records: tuple[StageRecord, ...] = ()
    timeout_s: float | None = None
    left_s: float | None = None
    estimate_s: float | None = None
    over: str | None = None

    def to_json(self) -> JsonObject:
        return {"stages": [r.to_json() for r in self.records],
                **optional_fields(timeout_s=self.timeout_s, left_s=self.left_s,
                                  estimate_s=self.estimate_s, over=self.over)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> VerificationStages:
        return cls(records=tuple(StageRecord.from_json(r) for r in data["stages"]),
                   timeout_s=data.get("timeout_s"), left_s=data.get("left_s"),
                   estimate_s=data.get("estimate_s"), over=data.get("over"))

    def lines(self) -> list[str]:
        """What the summary says: the stages that stopped early or were shortened, and
        whether even verification's minimum overran --timeout."""
        out = [r.line() for r in self.records if r.remarkable]
        if self.over:
            out.append(self.over)
        return out
