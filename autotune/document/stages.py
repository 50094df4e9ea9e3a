"""How verification's stages ran: each one's rounds (or pairs) against its cap, why it
stopped before the cap (``autotune.verify.sequential``) and what ``--timeout`` shortened
(``autotune.verify.fit``): ``verification_stages`` in best_config.json, and the lines
the summary prints about them."""
from __future__ import annotations

import dataclasses
import enum
from typing import Annotated

from pydantic import Field, computed_field

from autotune.schemas.typed import Omitted, Record


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
class StageRecord(Record):
    """One stage: ``ran`` of ``cap`` rounds (pairs for the standalone stage; None where it
    did not run); ``stopped``: why it ended before its cap; ``dropped``: what it stopped
    measuring before its end, and why; ``shortened``: what --timeout changed, and how;
    ``config``: the candidate it measured, where it measures one."""

    stage: Stage
    ran: Omitted[int] = None
    cap: Omitted[int] = None
    stopped: Omitted[str] = None
    dropped: Omitted[str] = None
    shortened: Omitted[str] = None
    config: Omitted[str] = None

    @property
    def remarkable(self) -> bool:
        """Whether it ran otherwise than asked: the summary says so."""
        return bool(self.stopped or self.dropped or self.shortened)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def note(self) -> str:
        """The summary's line, written beside the figures."""
        return self.line()

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


@dataclasses.dataclass(frozen=True, kw_only=True)
class VerificationStages(Record):
    """Every stage's record, in the order they ran; with ``--timeout``, the seconds it
    left verification (``left_s``), what the fitted stages were estimated to take
    (``estimate_s``), and ``over`` where even their minimum did not fit."""

    records: Annotated[tuple[StageRecord, ...], Field(alias="stages")] = ()
    timeout_s: Omitted[float] = None
    left_s: Omitted[float] = None
    estimate_s: Omitted[float] = None
    over: Omitted[str] = None

    def lines(self) -> list[str]:
        """What the summary says: the stages that stopped early or were shortened, and
        whether even verification's minimum overran --timeout."""
        out = [r.line() for r in self.records if r.remarkable]
        if self.over:
            out.append(self.over)
        return out
