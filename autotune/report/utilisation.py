"""The report's utilisation table: the baseline's and the pick's achieved FLOP/s, the
peak each is a share of and where that peak comes from (best_config.json's
``utilisation``, ``autotune.document.utilisation``)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from autotune.document.utilisation import Share, flop_rate

if TYPE_CHECKING:
    from autotune.document.run import RunDocument

# a report table's title, headers, rows and note (report.files.Table's fields)
TableFields = tuple[str, list[str], list[list[str]], str]


def utilisation_tables(doc: RunDocument) -> list[TableFields]:
    """The table's fields, or none where no FLOPs were counted."""
    found = doc.utilisation
    if found is None:
        return []

    def row(who: str, share: Share | None) -> list[str]:
        if share is None:
            return [who, "", "", "", "not measured", ""]
        return [who, f"{share.samples_per_s:,.1f}", flop_rate(share.flop_per_s), flop_rate(share.peak_flop_per_s),
                f"{share.share:.1%}", share.peak_source]

    rows = [row("baseline", found.baseline)]
    if doc.verified:
        rows.append(row("pick", found.pick))
    return [("Utilisation", ["", "samples/s", "achieved", "peak", "share of peak", "peak from"], rows,
             f"{found.flops_per_sample:.4g} FLOPs per sample, counted by {found.counted}. "
             "table: the GPU's datasheet peak without sparsity; measured: the best of a few large "
             "matmuls in the configuration's precision, with its threads and ranks")]
