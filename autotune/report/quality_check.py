"""The report's part on the quality check: a table of each judged configuration and a plot
of evaluate() along each training (``document.quality.QualityJudgement``)."""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from autotune.document.quality import QualityJudgement
from autotune.report.render import Table


def table(judged: Mapping[str, QualityJudgement]) -> Table:
    """One row per configuration the quality check judged."""
    rows = [[name, f"{j.spread:.4g}", f"{j.distance:+.4g}", f"{j.margin:.4g}",
             f"{j.allowed:.4g} ({j.allowance})", j.verdict.value] for name, j in judged.items()]
    first = next(iter(judged.values()))
    return Table("Quality check: each configuration that trades quality against fp32's own spread",
                 ["configuration", "fp32 spread", "below fp32's range", "allowed", "allowance", "verdict"], rows,
                 f"fp32 trained from {len(first.references)} seeds; spread: its range between them and the "
                 "candidate's distance below it, medians over the evaluations past the start-up; rejected beyond "
                 f"the larger of the allowance and {first.factor:g}x the spread (a precision that trains as fp32 "
                 f"does is rejected in at most {first.level:.0%} of checks); inconclusive where that margin, set by "
                 "fp32's noise, is half or more of what fp32 learned over the training")


def draw(figure: Callable[[float, float], Any], judged: Mapping[str, QualityJudgement]) -> Any:
    """One panel per configuration the quality check judged: evaluate() at each point of
    each fp32 training and of the candidate's."""
    if not judged:
        return None
    columns = min(3, len(judged))
    rows = -(-len(judged) // columns)
    fig = figure(4.5 * columns, 3.4 * rows)
    for i, (name, j) in enumerate(judged.items()):
        ax = fig.add_subplot(rows, columns, i + 1)
        for seed, scores in enumerate(j.references):
            ax.plot(j.points, scores, "o-", color="tab:gray", alpha=0.8,
                    label="fp32, each seed" if seed == 0 else None)
        ax.plot(j.points, j.candidate, "o-", color="tab:blue", label="candidate")
        ax.set_title(f"{name}: {j.verdict.value}", fontsize="medium")
        ax.set_xlabel("steps trained")
        ax.set_ylabel("evaluate()")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    return fig
