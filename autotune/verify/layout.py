"""The process layout's own effect, as verification measured it: the first candidate
against its layout contrast (``candidates.layout_contrast``), window against window."""
from __future__ import annotations

import dataclasses

from autotune.config import TrialConfig
from autotune.document.interval import Interval
from autotune.document.measures import LayoutEffect
from autotune.probes import Machine
from autotune.space import Space
from autotune.verify import stats
from autotune.verify.candidates import layout_contrast
from autotune.verify.verdict import Verdict


def layout_effect(verdicts: list[Verdict], top: TrialConfig, space: Space, machine: Machine) -> LayoutEffect | None:
    """The first candidate against its layout contrast, where verification measured both."""
    contrast = layout_contrast(top, space, machine)
    by_cfg = {v.config: v.speed for v in verdicts}
    if contrast is None or top not in by_cfg or contrast not in by_cfg:
        return None
    top_speed, contrast_speed = by_cfg[top], by_cfg[contrast]
    if top_speed is None or contrast_speed is None or not top_speed.samples_per_s or not contrast_speed.samples_per_s:
        return None
    a, b = top_speed.samples_per_s, contrast_speed.samples_per_s
    multi, single = (a, b) if top.nprocs > 1 else (b, a)
    multi_cfg, single_cfg = (top, contrast) if top.nprocs > 1 else (contrast, top)
    return LayoutEffect(multi_rank=multi_cfg.layout, single_process=single_cfg.layout,
                        other_knobs={k: v for k, v in top.to_dict().items()
                                     if k not in ("nprocs", "threads")},
                        effect=_interval(stats.paired_ratio(multi, single)))


def _interval(effect: Interval) -> Interval:
    """The document's interval leaves out the rounds: its reader counts them in the rates."""
    return dataclasses.replace(effect, rounds=None)
