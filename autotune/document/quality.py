"""What the quality check found for one configuration that trades quality: evaluate()'s
scores along each fp32 training and the candidate's, fp32's own spread between seeds, how
far the candidate fell below fp32's range, the allowance and the verdict."""
from __future__ import annotations

import dataclasses
import enum

from autotune.schemas.typed import Record


class QualityVerdict(str, enum.Enum):
    """A non-inferiority test has three outcomes: within fp32's noise and the allowance
    (accepted), below them (rejected), or trainings too noisy for their length to tell
    (inconclusive: never counted as a pass)."""

    ACCEPTED = "accepted"
    REJECTED = "rejected"
    INCONCLUSIVE = "inconclusive"


@dataclasses.dataclass(frozen=True, kw_only=True)
class QualityJudgement(Record):
    """``points``: the steps trained at each compared evaluation (after the warm-up; the
    last is the training's end). ``references``: evaluate() of each fp32 training (one per
    seed) at those points; ``candidate``: the candidate's, from the first reference's seed.
    ``untrained``: the fp32 trainings' score before any step (None where not scored), which
    ``gain`` (what fp32 learned by the end) is measured from. ``spread``: fp32's range between
    seeds, the median over the points; ``distance``: how far the candidate fell below fp32's
    range, the median over the points (negative: inside it or above). ``allowed``: the drop the
    allowance grants; ``margin``: the larger of it and ``factor`` times the spread, what
    ``distance`` must not pass. ``level``: how often a candidate that trains as fp32 does
    would be rejected at worst."""

    points: tuple[int, ...]
    references: tuple[tuple[float, ...], ...]
    candidate: tuple[float, ...]
    untrained: float | None
    spread: float
    distance: float
    allowed: float
    allowance: str
    factor: float
    margin: float
    gain: float | None
    level: float
    verdict: QualityVerdict

    def words(self) -> str:
        """One line for the summary: the figures the verdict rests on."""
        ends = [r[-1] for r in self.references]
        text = (f"{self.verdict.value}: evaluate() {self.candidate[-1]:.4g} at the end against fp32's "
                f"{min(ends):.4g}-{max(ends):.4g}, {self.distance:+.4g} below fp32's range over {len(self.references)} "
                f"seeds (fp32's spread {self.spread:.4g}; allowed {self.margin:.4g}, the larger of "
                f"{self.allowed:.4g} ({self.allowance}) and {self.factor:g}x the spread")
        if self.verdict is QualityVerdict.INCONCLUSIVE and self.gain is not None:
            text += f"; fp32 gained only {self.gain:.4g} over the training"
        return text + f"; a test that rejects at most {self.level:.0%} of precisions that train as fp32 does)"

