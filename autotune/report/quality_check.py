"""The report's part on the quality check: a table of each judged configuration and a plot
of evaluate() along each training (``document.quality.QualityJudgement``)."""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from autotune.document.quality import QualityJudgement
from autotune.report.render import Table


def table(judged: Mapping[str, QualityJudgement]) -> Table:
    """One row per configuration the quality check judged."""
    rows = [[name, str(j.seeds), f"{j.mean_drop:+.4g}", f"{j.low:+.4g} to {j.high:+.4g}", f"{j.spread:.4g}",
             f"{j.margin:.4g}", f"{j.allowed:.4g} ({j.allowance})", f"{j.samples:,}", j.verdict.value]
            for name, j in judged.items()]
    first = next(iter(judged.values()))
    return Table("Quality check: each configuration that trades quality against its fp32 twin",
                 ["configuration", "seeds", "mean drop", f"{first.level:.0%} interval", "fp32 spread", "margin",
                  "allowance", "samples", "verdict"], rows,
                 "each seed trains the candidate and fp32 from the same initial weights and data order; the drop is "
                 "fp32's evaluate() less the candidate's, the median over the evaluations past the start-up; "
                 "accepted where the interval's upper end is within the margin, rejected where its lower end is "
                 "beyond it, seeds added until one holds; margin: the larger of the allowance and "
                 f"{first.noise_share:g}x fp32's standard deviation between seeds (where fp32 learned well beyond it)")


def draw(figure: Callable[[float, float], Any], judged: Mapping[str, QualityJudgement]) -> Any:
    """One panel per configuration the quality check judged: evaluate() at each point of
    each seed's fp32 training (grey) and the candidate's (blue)."""
    if not judged:
        return None
    columns = min(3, len(judged))
    rows = -(-len(judged) // columns)
    fig = figure(4.5 * columns, 3.4 * rows)
    for i, (name, j) in enumerate(judged.items()):
        ax = fig.add_subplot(rows, columns, i + 1)
        for seed, (scores, cand) in enumerate(zip(j.references, j.candidates)):
            first = seed == 0
            ax.plot(j.points, scores, "o-", color="tab:gray", alpha=0.8, label="fp32, each seed" if first else None)
            ax.plot(j.points, cand, "o--", color="tab:blue", alpha=0.8, label="candidate, same seed" if first else None)
        ax.set_title(f"{name}: {j.verdict.value}", fontsize="medium")
        ax.set_xlabel("samples trained")
        ax.set_ylabel("evaluate()")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    return fig
