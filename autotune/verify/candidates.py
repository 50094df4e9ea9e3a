"""What verification re-measures: the search's best, and beside it the configurations the
search's one trial each could not tell from it (the other process layout, the other process
kind, the other precision kind, another batch size within noise)."""
from __future__ import annotations

from collections.abc import Callable, Sequence

from autotune.config import TrialConfig
from autotune.probes import Machine
from autotune.runtime.knobs import Device
from autotune.search import late
from autotune.search.outcome import Candidate
from autotune.space import Space


def layout_contrast(top: TrialConfig, space: Space, machine: Machine) -> TrialConfig | None:
    """The top candidate with the other process layout (several ranks <-> one process
    on all cores), every other knob equal: verification measures it alongside, which
    gives the layout's own effect with an interval."""
    if top.device != Device.CPU:
        return None
    cores = machine.cpu.usable_cores
    if top.nprocs > 1:
        other = top.replace(nprocs=1, threads=cores)
    else:
        ranks = next((layout.nprocs for layout in space.layouts
                      if layout.nprocs > 1 and layout.threads == 1), None)
        if ranks is None or top.batch_size % ranks:
            return None
        other = top.replace(nprocs=ranks, threads=cores // ranks)
    return other if other.layout in space.choices["layout"] else None


def batch_rival(ranked: Sequence[Candidate]) -> TrialConfig | None:
    """The best configuration at another batch size than the search's best, of its
    precision kind, where its search value is within the noise of the best's (the larger of
    ``late.NOISE`` and either trial's spread between windows); None otherwise. Two batch
    sizes a few percent apart in one trial each are not told apart by the search; side by
    side, verification tells them apart."""
    if not ranked:
        return None
    first = ranked[0]
    other = next((c for c in ranked[1:] if c.config.batch_size != first.config.batch_size
                  and c.config.exact == first.config.exact), None)
    if other is None:
        return None
    margin = max(late.NOISE, late.spread(first.result), late.spread(other.result))
    return other.config if other.value >= first.value * (1 - margin) else None


def choose_candidates(ranked: list[TrialConfig], *, top: int, space: Space, machine: Machine,
                      fits: Callable[[TrialConfig], bool] = lambda cfg: True,
                      rival: TrialConfig | None = None) -> list[TrialConfig]:
    """What verification re-measures: the ``top`` best by search value; the first one's
    layout contrast; when the top ones are all several-rank or all one-process, the
    best-measured configuration of the other kind; the best exact (fp32, unpruned)
    and best reduced-precision configurations; and ``rival`` (``batch_rival``), whichever
    are not among them yet.

    The other process kind: a search trial's value is one process measured once, and on
    a shared machine that drifts by as much as the top configurations differ;
    verification's alternating windows resolve such differences. The exact one: a
    reduced-precision candidate can fail the numerics or quality check, and then the
    fastest exact configuration is what the user should get, not the baseline. The layout
    contrast, which the search did not measure, only where it is known to fit in memory
    (``fits``: search.memory.known_to_fit)."""
    candidates = ranked[:top]
    if not candidates:
        return []
    contrast = layout_contrast(candidates[0], space, machine)
    if contrast is not None and contrast not in candidates and fits(contrast):
        candidates.append(contrast)
    kinds = {c.nprocs > 1 for c in ranked[:top]}
    extra = [next((c for c in ranked if (c.nprocs > 1) not in kinds), None),
             next((c for c in ranked if c.exact), None),
             next((c for c in ranked if not c.exact), None), rival]
    for cfg in extra:
        if cfg is not None and cfg not in candidates:
            candidates.append(cfg)
    return candidates
