"""What a gate that judges by evaluate() found for one configuration (the quality check:
a precision or pruning against its fp32 twin; the batch check: a batch against the user's):
evaluate() along each seed's pair of trainings, the paired differences, fp32's own spread
between seeds, the margin, the interval and the verdict (``autotune.verify.decide``)."""
from __future__ import annotations

import dataclasses
import enum

from autotune.schemas.typed import Omitted, Record


class QualityVerdict(str, enum.Enum):
    """A non-inferiority test has three outcomes: the candidate's drop is shown to be within
    the margin (accepted), shown to be beyond it (rejected), or neither once the seeds
    verification holds are spent (inconclusive: never counted as a pass)."""

    ACCEPTED = "accepted"
    REJECTED = "rejected"
    INCONCLUSIVE = "inconclusive"


@dataclasses.dataclass(frozen=True, kw_only=True)
class QualityJudgement(Record):
    """``points``: the samples trained at each compared evaluation (past the start-up; the
    last is the training's end). ``references``: evaluate() of the training judged against
    (fp32, or the user's batch), one row per seed, at those points; ``candidates``: the
    candidate's from the same seeds (the same initial weights and data order). ``untrained``:
    the references' score before any step (None where not scored), which ``gain`` (what they
    learned by the end) is measured from. ``drops``: per seed, the reference's score less the
    candidate's, the median over the points (positive: the candidate scored lower);
    ``mean_drop`` their mean and ``low``-``high`` its two-sided ``level`` interval (Student's t
    over the seeds). ``spread``: the references' standard deviation between seeds, the median
    over the points; ``allowed``: the drop the allowance grants; ``margin``: the larger of it
    and ``noise_share`` times the spread, where the spread may widen it (``noise_widens``).
    Accepted where ``high`` is within the margin, rejected where ``low`` is beyond it
    (``settled``); where neither once the seeds are spent, inconclusive, or, for a batch,
    accepted (not shown beyond the margin).
    ``samples``: how many samples each training trained, ``length`` that in words against the
    user's own training; ``more_s``: what one more seed would have cost (an inconclusive
    verdict: the seeds verification holds were spent)."""

    points: tuple[int, ...]
    references: tuple[tuple[float, ...], ...]
    candidates: tuple[tuple[float, ...], ...]
    untrained: float | None
    gain: float | None
    drops: tuple[float, ...]
    mean_drop: float
    low: float
    high: float
    level: float
    spread: float
    allowed: float
    allowance: str
    noise_share: float
    noise_widens: bool
    margin: float
    verdict: QualityVerdict
    settled: bool
    samples: int
    length: str
    more_s: Omitted[float] = None

    @property
    def seeds(self) -> int:
        return len(self.drops)

    def words(self) -> str:
        """One line for the summary: the test, the figures the verdict rests on, and the
        length it was taken at."""
        margin = (f"the larger of {self.allowed:.4g} ({self.allowance}) and {self.noise_share:g}x fp32's standard "
                  f"deviation between seeds, {self.spread:.4g}" if self.noise_widens
                  else f"{self.allowed:.4g} ({self.allowance})")
        text = (f"{self.verdict.value}: over {self.seeds} paired seeds the candidate lost {self.mean_drop:+.4g} on "
                f"average ({self.level:.0%} interval {self.low:+.4g} to {self.high:+.4g}) against a margin of "
                f"{self.margin:.4g}, {margin}")
        if not self.noise_widens and self.gain is not None and self.spread > 0:
            text += f"; fp32's spread {self.spread:.4g} against the {self.gain:.4g} it learned: too noisy to widen it"
        if self.verdict is QualityVerdict.ACCEPTED and not self.settled:
            text += f"; not shown beyond it after {self.seeds} seeds, the most verification holds"
        if self.verdict is QualityVerdict.INCONCLUSIVE:
            text += (f"; neither shown within it nor beyond it after {self.seeds} seeds, the most verification holds"
                     + (f" (each more seed about {self.more_s:.0f} s)" if self.more_s else ""))
        return text + f"; judged after {self.length}"
