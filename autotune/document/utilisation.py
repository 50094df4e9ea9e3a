"""How close the baseline and the pick run to the hardware's peak: their achieved FLOP/s
(the FLOPs per sample their trial counted, times the samples/s measured for them) and
its share of the peak FLOP/s of their ranks in their precision, as best_config.json's
``utilisation`` holds it and the summary and the report show it."""
from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from typing import Annotated, Any

from pydantic import Field

from autotune.config import TrialConfig
from autotune.probes.peaks import mfu_peak
from autotune.runtime.json_value import JsonValue
from autotune.schemas.typed import Record

COUNTED = ("FlopCounterMode on one real batch: the model's forward and backward passes, "
           "uncompiled and without activation checkpointing's recomputation; the optimizer's "
           "element-wise update is not counted")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Counted(Record):
    """What a trial's first step counted (its facts' ``utilisation``): the model's FLOPs per
    sample and the peak FLOP/s of its ranks in its precision, with where that peak comes
    from; None each where it was not counted."""

    flops_per_sample: float | None = None
    peak_flop_per_s: float | None = None
    peak_source: str | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Share(Record):
    """One configuration's achieved FLOP/s and its share of the peak it runs against."""

    flops_per_sample: Annotated[float, Field(gt=0)]
    samples_per_s: Annotated[float, Field(gt=0)]
    flop_per_s: Annotated[float, Field(ge=0)]
    peak_flop_per_s: Annotated[float, Field(gt=0)]
    # "table:<GPU> <precision> dense" (its datasheet) or "measured:<device> <precision>
    # matmul[, N threads][ x N ranks]"
    peak_source: Annotated[str, Field(pattern=r"^(table|measured):")]
    share: Annotated[float, Field(ge=0)]

    @classmethod
    def of(cls, counted: Counted | None, *, samples_per_s: float | None) -> Share | None:
        """From a trial's utilisation facts and the samples/s measured for it; None where
        its FLOPs were not counted or it has no peak (or none it can name)."""
        if counted is None or not samples_per_s:
            return None
        flops, peak, source = counted.flops_per_sample, counted.peak_flop_per_s, counted.peak_source
        if not flops or not peak or not source:
            return None
        achieved = flops * samples_per_s
        return cls(flops_per_sample=flops, samples_per_s=samples_per_s, flop_per_s=achieved,
                   peak_flop_per_s=peak, peak_source=source, share=achieved / peak)

    @property
    def peak_words(self) -> str:
        """The peak's source in words: ``measured:cpu fp32 matmul, 2 threads x 2 ranks`` as
        ``the measured cpu fp32 matmul peak on 2 threads x 2 ranks``."""
        kind, _, what = self.peak_source.partition(":")
        ranks = re.search(r" x (\d+) ranks$", what)
        what = what[: ranks.start()] if ranks else what
        what, _, threads = what.partition(", ")
        on = [part for part in (threads, f"{ranks.group(1)} ranks" if ranks else "") if part]
        source = "datasheet's" if kind == "table" else kind
        return f"the {source} {what} peak" + (f" on {' x '.join(on)}" if on else "")


def flop_rate(value: float) -> str:
    """FLOP/s in the unit that reads best: ``41 GFLOP/s``."""
    for unit, scale in (("PFLOP/s", 1e15), ("TFLOP/s", 1e12), ("GFLOP/s", 1e9), ("MFLOP/s", 1e6)):
        if value >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value:.3g} FLOP/s"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Utilisation(Record):
    """best_config.json's ``utilisation``: the user's model's FLOPs per sample, and the
    baseline's and the pick's share of their peak (the pick's None where the baseline
    is emitted, or where its FLOPs or peak were not measured)."""

    flops_per_sample: float
    baseline: Share | None
    pick: Share | None
    counted: str = COUNTED

    @classmethod
    def of(cls, *, baseline_facts: Counted | None, baseline_samples_per_s: float,
           pick_facts: Counted | None, pick_samples_per_s: float | None) -> Utilisation | None:
        baseline = Share.of(baseline_facts, samples_per_s=baseline_samples_per_s)
        pick = Share.of(pick_facts, samples_per_s=pick_samples_per_s)
        counted = baseline or pick
        if counted is None:
            return None
        return cls(flops_per_sample=counted.flops_per_sample, baseline=baseline, pick=pick)

    def lines(self) -> list[str]:
        """The summary's line: ``utilisation: baseline 3.1% -> pick 9.8% of the measured
        cpu fp32 matmul peak (41 GFLOP/s of 420 GFLOP/s)``."""
        b, p = self.baseline, self.pick
        if b is not None and p is not None:
            same = b.peak_source == p.peak_source
            text = (f"utilisation: baseline {b.share:.1%} -> pick {p.share:.1%} of "
                    + (f"{p.peak_words} ({flop_rate(b.flop_per_s)} -> {flop_rate(p.flop_per_s)} "
                       f"of {flop_rate(p.peak_flop_per_s)})" if same else
                       f"their peaks (baseline {flop_rate(b.flop_per_s)} of {b.peak_words}, "
                       f"{flop_rate(b.peak_flop_per_s)}; pick {flop_rate(p.flop_per_s)} of {p.peak_words}, "
                       f"{flop_rate(p.peak_flop_per_s)})"))
        else:
            one, who = (b, "baseline") if b is not None else (p, "pick")
            assert one is not None
            text = (f"utilisation: {who} {one.share:.1%} of {one.peak_words} "
                    f"({flop_rate(one.flop_per_s)} of {flop_rate(one.peak_flop_per_s)})")
        lines = [text]
        mfu = [(who, one, peak) for who, one in (("baseline", b), ("pick", p))
               if one is not None and (peak := mfu_peak(one.peak_source)) is not None
               and peak.source != one.peak_source]
        if mfu:
            lines.append("  of the dense bf16 peak (MFU): " + ", ".join(
                f"{who} {one.flop_per_s / peak.flop_per_s:.1%}" for who, one, peak in mfu)
                + f" of {flop_rate(mfu[0][2].flop_per_s)}")
        return [*lines, f"  {self.flops_per_sample:.4g} FLOPs per sample (forward and backward)"]


def trial_facts(facts: Mapping[str, JsonValue] | None) -> Counted | None:
    """The utilisation facts among a search trial's first-step ``facts`` (None before them)."""
    found = (facts or {}).get("utilisation")
    return Counted.from_json(found) if isinstance(found, Mapping) and found else None


def pick_facts(chosen: TrialConfig, measured: Sequence[tuple[TrialConfig, Mapping[str, JsonValue] | None]],
               *, work_key: Any) -> Counted | None:
    """The pick's utilisation facts: its own trial's, else those of a trial of the same
    work (ablation may drop a placement knob) whose peak is the pick's too: the same
    ranks, and the same threads where the peak was measured with them. Else, for a pick
    no trial ran (a layout verification made from another), the model's FLOPs per sample
    from a trial of the same model (pruned alike) and the peak of a trial of the same
    device, precision, ranks and threads: a peak is the hardware's, whatever the work."""
    for cfg, result in measured:
        if cfg == chosen and trial_facts(result):
            return trial_facts(result)
    for cfg, result in measured:
        facts = trial_facts(result)
        if not facts or work_key(cfg) != work_key(chosen) or cfg.nprocs != chosen.nprocs:
            continue
        if (facts.peak_source or "").startswith("table:") or cfg.threads == chosen.threads:
            return facts
    counted = [(cfg, facts) for cfg, result in measured if (facts := trial_facts(result))]
    flops = next((f.flops_per_sample for cfg, f in counted
                  if f.flops_per_sample and cfg.prune_ratio == chosen.prune_ratio), None)
    peak = next((f for cfg, f in counted if f.peak_flop_per_s and (cfg.device, cfg.precision, cfg.nprocs)
                 == (chosen.device, chosen.precision, chosen.nprocs)
                 and ((f.peak_source or "").startswith("table:") or cfg.threads == chosen.threads)), None)
    if flops is None or peak is None:
        return None
    return dataclasses.replace(peak, flops_per_sample=flops)
