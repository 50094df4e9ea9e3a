"""How the emitted configuration sits in memory (best_config.json's ``memory``): its
ranks' peak against the limit, the baseline's, and where memory knobs made it fit, what
ran out of memory without them and the fastest configuration that fit without any."""
from __future__ import annotations

import dataclasses

from autotune.schemas.typed import Record


@dataclasses.dataclass(frozen=True, kw_only=True)
class BestWithout(Record):
    """The fastest configuration the search measured within the limit with no memory knob
    (``config``, short) and its rate, beside the emitted one's, both as the search measured them."""

    config: str
    samples_per_s: float
    chosen_samples_per_s: float


@dataclasses.dataclass(frozen=True, kw_only=True)
class MemoryFit(Record):
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
