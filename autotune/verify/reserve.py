"""What the search leaves verification under --timeout: it starts no trial after which
verification at its least (``fit.least``) would not fit in what is left."""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from autotune.search.memory import MemoryLimit
from autotune.search.outcome import SearchOutcome
from autotune.sections import MeasureOptions, VerifyOptions
from autotune.space import Space
from autotune.verify import fit
from autotune.verify.candidates import batch_rival, choose_candidates
from autotune.verify.deadline import Costs
from autotune.workbench import Workbench


def leave_for_verification(bench: Workbench, verify: VerifyOptions, measure: MeasureOptions, *, space: Space,
                           limit: MemoryLimit, ends_at: float) -> Callable[[SearchOutcome], str | None]:
    """Why the search starts no more trials: what is left until ``ends_at`` would not hold
    another trial and verification at its least (the candidates the search has so far, with
    its costs estimated from the trials so far)."""
    def enough(outcome: SearchOutcome) -> str | None:
        if outcome.baseline is None or not outcome.ranked:
            return None
        baseline = outcome.baseline.config
        others = [c for c in outcome.ranked if c.config != baseline]
        candidates = choose_candidates([c.config for c in others], top=verify.top, space=space,
                                       machine=bench.machine, fits=outcome.fits(limit), rival=batch_rival(others))
        costs = Costs.from_trials([c.result for c in outcome.ranked], window_s=measure.window_s,
                                  baseline_rate=outcome.baseline.measured.samples_per_s)
        settings = verify.settings.on(bench.machine, [(c, r.cuda_peak_mb) for c, r in outcome.results()])
        need = fit.least(settings, candidates, baseline=baseline, costs=costs,
                         has_evaluate=bench.task.has_evaluate, shortest_run_s=measure.shortest_run_s)
        walls = [c.result.wall_s or 0.0 for c in outcome.ranked]
        if not room_for_another(now=time.time(), ends_at=ends_at, trial_walls=walls, need_s=need):
            return (f"--timeout {verify.timeout_s:g} s: the rest is verification's, about {need:.0f} s "
                    "at its least")
        return None
    return enough


def room_for_another(*, now: float, ends_at: float, trial_walls: Sequence[float], need_s: float) -> bool:
    """Whether another trial and then verification at its least (``need_s``, with
    ``fit.MARGIN``) fit by ``ends_at``. The next trial may start a fresh process where the
    last ones ran warm, and a new best brings other candidates: room is kept for the
    longest trial so far."""
    return now + max(trial_walls, default=0.0) + need_s * fit.MARGIN <= ends_at
