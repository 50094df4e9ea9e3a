"""The process layout's own effect, as verification measured it: the winner (else the first
candidate) against its layout contrast (``candidates.layout_contrast``), window against window."""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from autotune.config import TrialConfig
from autotune.document.interval import Interval
from autotune.document.measures import LayoutEffect
from autotune.probes import Machine
from autotune.space import Space
from autotune.verify import stats
from autotune.verify.candidates import layout_contrast
from autotune.verify.verdict import Verdict


def run_layout_effect(winner: Verdict | None, verdicts: list[Verdict], candidates: Sequence[TrialConfig],
                      space: Space, machine: Machine) -> LayoutEffect | None:
    """What a run says of its process layout: read from the winner, else a candidate that passed,
    else one that did not (rejected later, for its quality, say: its speed was measured beside its
    other layout all the same), else the first candidate."""
    tops = [*([winner.config] if winner is not None else []), *(v.config for v in verdicts if v.passed),
            *(v.config for v in verdicts if not v.passed), *candidates[:1]]
    return layout_effect(verdicts, tops, space, machine)


def layout_effect(verdicts: list[Verdict], tops: Sequence[TrialConfig], space: Space,
                  machine: Machine) -> LayoutEffect | None:
    """The first of ``tops`` (the winner, the candidates that passed, those that did not) against
    its layout contrast, where verification measured both side by side."""
    rates = {v.config: v.speed.samples_per_s for v in verdicts if v.speed is not None and v.speed.samples_per_s}
    top = next((t for t in tops if t in rates and layout_contrast(t, space, machine) in rates), None)
    contrast = layout_contrast(top, space, machine) if top is not None else None
    if top is None or contrast is None:
        return None
    a, b = rates[top], rates[contrast]
    multi, single = (a, b) if top.nprocs > 1 else (b, a)
    multi_cfg, single_cfg = (top, contrast) if top.nprocs > 1 else (contrast, top)
    return LayoutEffect(multi_rank=multi_cfg.layout, single_process=single_cfg.layout,
                        other_knobs={k: v for k, v in top.to_dict().items()
                                     if k not in ("nprocs", "threads")},
                        effect=_interval(stats.paired_ratio(multi, single)))


def _interval(effect: Interval) -> Interval:
    """The document's interval leaves out the rounds: its reader counts them in the rates."""
    return dataclasses.replace(effect, rounds=None)
