"""What the search leaves verification under --timeout: it starts no trial after which
verification at its least (``fit.least``) would not fit in what is left, and a compiled
trial on a GPU is priced against what is left of the run less that least."""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence

from autotune.search import late
from autotune.search.memory import MemoryLimit
from autotune.search.outcome import SearchOutcome
from autotune.sections import MeasureOptions, VerifyOptions
from autotune.space import Space
from autotune.task.objective import PlannedRun
from autotune.verify import fit
from autotune.verify.candidates import batch_rival, choose_candidates
from autotune.verify.deadline import FROM_CACHE_SHARE, Costs
from autotune.verify.sequential import PAIRS_FEWEST
from autotune.verify.settings import Settings
from autotune.workbench import Workbench


@dataclasses.dataclass(frozen=True)
class Reserve:
    """What the search leaves verification until ``ends_at`` (epoch seconds): ``need(outcome)``
    is verification at its least for the search's outcome so far, in seconds."""

    ends_at: float
    need: Callable[[SearchOutcome], float | None]
    timeout_s: float

    def enough(self, outcome: SearchOutcome) -> str | None:
        """Why the search starts no more trials: what is left would not hold another trial
        and verification at its least; None while it would."""
        need = self.need(outcome)
        if need is None:
            return None
        if not room_for_another(now=time.time(), ends_at=self.ends_at, trial_walls=_walls(outcome), need_s=need):
            return (f"--timeout {self.timeout_s:g} s: the rest is verification's, about {need:.0f} s "
                    "at its least")
        return None

    def room_s(self, outcome: SearchOutcome, once_s: float) -> float:
        """The seconds left of --timeout once verification at its least is kept, should a
        configuration that compiles for ``once_s`` win: then each of verification's processes
        of it (its gates', its held one, its standalone runs) compiles it again from the
        run's cache. What a compiled trial's compile may take, whatever the search's share
        says."""
        need = (self.need(outcome) or 0.0) + (2 + PAIRS_FEWEST) * FROM_CACHE_SHARE * once_s
        # the trial's own start and windows besides its compile: as long as the longest so far
        return self.ends_at - time.time() - max(_walls(outcome), default=0.0) - need * fit.MARGIN


def _walls(outcome: SearchOutcome) -> list[float]:
    """The search's trials' wall times, each less the compile of one that compiled on a GPU:
    a compiled trial there is priced with its compile on its own (``search.late.too_late``),
    and no other trial pays it again."""
    return [(c.result.wall_s or 0.0) - (c.result.one_time_s or 0.0 if late.priced_on_the_run(c.config) else 0.0)
            for c in outcome.ranked]


def leave_for_verification(workbench: Workbench, verify: VerifyOptions, measure: MeasureOptions, *, space: Space,
                           limit: MemoryLimit, ends_at: float, plan: PlannedRun | None = None,
                           fresh_start: tuple[float, float] | None = None) -> Reserve:
    """What the search leaves verification by ``ends_at``: verification at its least for the
    candidates the search has so far, with its costs estimated from the trials so far."""
    def need(outcome: SearchOutcome) -> float | None:
        if outcome.baseline is None or not outcome.ranked:
            return None
        baseline = outcome.baseline.config
        others = [c for c in outcome.ranked if c.config != baseline]
        candidates = choose_candidates([c.config for c in others], top=verify.top, space=space,
                                       machine=workbench.machine, fits=outcome.fits(limit), rival=batch_rival(others))
        costs = Costs.of_search(outcome, window_s=measure.window_s, evaluate_s=workbench.task.evaluate_s,
                                fresh_start=fresh_start)
        settings = Settings.asked(verify).lengthened(workbench.task, plan, costs.rates).on(
            workbench.machine, [(c, r.cuda_peak_mb) for c, r in outcome.results()])
        return fit.least(settings, candidates, baseline=baseline, costs=costs,
                         has_evaluate=workbench.task.has_evaluate, shortest_run_s=measure.shortest_run_s)
    return Reserve(ends_at=ends_at, need=need, timeout_s=float(verify.timeout_s or 0.0))


def room_for_another(*, now: float, ends_at: float, trial_walls: Sequence[float], need_s: float) -> bool:
    """Whether another trial and then verification at its least (``need_s``, with
    ``fit.MARGIN``) fit by ``ends_at``. The next trial may start a fresh process where the
    last ones ran warm, and a new best brings other candidates: room is kept for the
    longest trial so far."""
    return now + max(trial_walls, default=0.0) + need_s * fit.MARGIN <= ends_at
