"""How the emitted configuration sits in memory (best_config.json's ``memory``): its
ranks' peak against the limit, the baseline's, and where memory knobs made it fit, what
ran out of memory without them and the fastest configuration that fit without any."""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from autotune.runtime.json_value import JsonObject


@dataclasses.dataclass(frozen=True, kw_only=True)
class BestWithout:
    """The fastest configuration the search measured within the limit with no memory knob
    (``config``, short) and its rate, beside the emitted one's, both as the search measured them."""

    config: str
    samples_per_s: float
    chosen_samples_per_s: float

    def to_json(self) -> JsonObject:
        return {"config": self.config, "samples_per_s": self.samples_per_s,
                "chosen_samples_per_s": self.chosen_samples_per_s}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> BestWithout:
        return cls(config=data["config"], samples_per_s=data["samples_per_s"],
                   chosen_samples_per_s=data["chosen_samples_per_s"])


@dataclasses.dataclass(frozen=True, kw_only=True)
class MemoryFit:
    """``limit_mb``: what one rank of the emitted configuration may hold (None: no limit
    applies, as on a GPU without --memory-limit, where CUDA itself refuses more);
    ``source``: where the limit comes from; the peaks are the search's, of the rank that
    held the most (host memory on CPU, device memory on CUDA). ``memory_knobs``: the
    emitted configuration's; ``without``: what ran out of memory without them;
    ``best_without``: the fastest configuration the search measured within the limit with
    no memory knob (``config``, its ``samples_per_s`` and the emitted one's
    ``chosen_samples_per_s``, both as the search measured them), None where none fit."""

    limit_mb: float | None
    source: str
    chosen_peak_mb: float | None
    baseline_peak_mb: float | None  # the user's own configuration's
    memory_knobs: tuple[str, ...] = ()
    # where the user's own configuration ran out of memory or over the limit: why, and the
    # configuration verification measured in its place (it holding less)
    baseline_over: str | None = None
    reference: str | None = None
    alone: bool = False  # the emitted peak is its script's, run alone (else the search's)
    without: str | None = None
    best_without: BestWithout | None = None

    def lines(self) -> list[str]:
        """The summary's lines."""
        if self.chosen_peak_mb is None:
            return []
        where = (f", {self.chosen_peak_mb / self.limit_mb:.0%} of the {self.source} "
                 f"({self.limit_mb:,.0f} MiB a rank)" if self.limit_mb else "")
        how = " (its script, run alone)" if self.alone else ""
        lines = [f"memory: the emitted configuration peaks at {self.chosen_peak_mb:,.0f} MiB a rank{how}{where}."]
        if self.baseline_over:
            instead = (f": the speedup is over it as it fits, {self.reference}" if self.reference else "")
            lines.append(f"  your configuration {self.baseline_over}{instead}.")
        if self.memory_knobs:
            fit = f"  {' and '.join(self.memory_knobs)} made it fit"
            lines.append(f"{fit}: without, {self.without}." if self.without else f"{fit}.")
            best = self.best_without
            if best is None:
                lines.append("  no configuration the search measured fit without a memory knob.")
            else:
                ratio = best.chosen_samples_per_s / best.samples_per_s
                lines.append(f"  the fastest that fit without one, {best.config}, ran at "
                             f"{best.samples_per_s:,.1f} samples/s in the search; the emitted one at "
                             f"{best.chosen_samples_per_s:,.1f} ({ratio:.2f}x).")
        return lines

    def to_json(self) -> JsonObject:
        return {"limit_mb": self.limit_mb, "source": self.source, "chosen_peak_mb": self.chosen_peak_mb,
                "baseline_peak_mb": self.baseline_peak_mb, "memory_knobs": list(self.memory_knobs),
                "baseline_over": self.baseline_over, "reference": self.reference, "alone": self.alone,
                "without": self.without,
                "best_without": self.best_without.to_json() if self.best_without is not None else None}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> MemoryFit:
        return cls(limit_mb=data["limit_mb"], source=data["source"], chosen_peak_mb=data["chosen_peak_mb"],
                   baseline_peak_mb=data["baseline_peak_mb"], memory_knobs=tuple(data["memory_knobs"]),
                   baseline_over=data.get("baseline_over"), reference=data.get("reference"),
                   alone=bool(data.get("alone")),
                   without=data.get("without"),
                   best_without=BestWithout.from_json(data["best_without"]) if data.get("best_without") else None)
