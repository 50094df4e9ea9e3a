"""Going on where the best lies at an edge: a knob whose values are ordered (the batch size,
DataLoader workers) is tried one value further on the best configuration when the best
holds the largest (or smallest) value measured, and the value beyond it is unmeasured.

A short search samples few values of each knob. Where throughput still rises at the
largest batch measured, one step of a power of two from the best, taken once, stops
short of a best batch several steps away: the refinement instead climbs, one trial at a
time, while each step beats the last.
"""
from __future__ import annotations

from collections.abc import Iterable

from autotune.config import KnobValue, TrialConfig
from autotune.errors import UsageError
from autotune.space import Space

# The knobs whose values lie on a line, where the best of those measured may not be the
# best of the line. The batch size is judged within the best's own family (its other
# knobs the same): another configuration's batches say little about this one's. The
# others are judged by what the search tried anywhere.
ORDERED = ("batch_size", "num_workers")


def _but(cfg: TrialConfig, knob: str) -> dict[str, KnobValue]:
    return {k: v for k, v in cfg.to_dict().items() if k != knob}


def steps(best: TrialConfig, *, space: Space, tried: Iterable[TrialConfig]) -> list[tuple[str, TrialConfig]]:
    """``best`` one value further along each ordered knob where it holds an edge of the
    values ``tried`` (the configurations measured, failed or running), up before down,
    as (knob, configuration); a batch the best's ranks cannot split is left out."""
    tried = list(tried)
    out: list[tuple[str, TrialConfig]] = []
    for knob in ORDERED:
        values = sorted(space.choices.get(knob, []))
        mine = getattr(best, knob)
        if len(values) < 2 or mine not in values:
            continue
        if knob == "batch_size":
            family = _but(best, knob)
            seen = {c.batch_size for c in tried if _but(c, knob) == family} | {mine}
        else:
            seen = {getattr(c, knob) for c in tried} | {mine}
        i = values.index(mine)
        for j, at_edge in ((i + 1, mine >= max(seen)), (i - 1, mine <= min(seen))):
            if not at_edge or not 0 <= j < len(values) or values[j] in seen:
                continue
            if knob == "batch_size" and values[j] % best.nprocs:
                continue
            try:
                out.append((knob, best.replace(**{knob: values[j]})))
            except UsageError:  # a batch its accumulation steps cannot split
                continue
    return out
