"""``Kept``: the configuration a run kept without emitting it. Its standalone pairs were
faster by their median but did not clear 1x, so the baseline was emitted; its scripts stay
where verification wrote them, and ``autotune verify OUTDIR`` measures them again."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import ClassVar

from pydantic import computed_field

from autotune.config import TrialConfig
from autotune.document.interval import Centre, Inline, Interval
from autotune.document.measures import VerifiedSpeedup
from autotune.schemas.typed import Omitted, Record


@dataclasses.dataclass(frozen=True, kw_only=True)
class Kept(Inline, Record):
    """The configuration, its launch.sh relative to the output folder (a moved folder still
    finds it), and its standalone pairs' figures: the median and where a re-run of as many
    pairs lands (``interval``), the figure a re-run stays above, and how many pairs ran."""

    config: TrialConfig
    launcher: str
    interval: Interval
    pairs: int
    lower_bound: Omitted[float] = None

    INTERVAL: ClassVar[str] = "interval"
    CENTRE: ClassVar[Centre] = "median"

    @computed_field  # type: ignore[prop-decorator]
    @property
    def config_short(self) -> str:
        return self.config.short()

    @classmethod
    def of(cls, config: TrialConfig, *, launcher: str, speedup: VerifiedSpeedup) -> Kept:
        return cls(config=config, launcher=launcher, interval=speedup.interval, pairs=speedup.pairs,
                   lower_bound=speedup.lower_bound)

    def words(self, folder: str | None) -> str:
        """What the run did with it, the rest of a sentence that names it ("X was ..."):
        ``folder`` is the output folder as the user named it; None (a report inside the
        folder): paths relative to it."""
        iv = self.interval
        rerun = f"{iv.low:.2f}-{iv.high:.2f}x"
        # the standalone check fails a candidate whose figure a re-run stays above is not over
        # 1x, so this interval reaches below 1x; one that judged the median's own interval
        # (older documents) may have failed a candidate whose re-run interval does not
        doubt = (f"a re-run may be slower on this machine ({rerun})" if iv.low < 1.0
                 else f"its pairs did not clear 1x (a re-run lands in {rerun})")
        again = (f"`autotune verify {folder}` measures it again (its scripts: {Path(folder, self.launcher)})"
                 if folder is not None else
                 f"`autotune verify` on this folder measures it again (its scripts: {self.launcher})")
        return (f"faster by a median of {iv.ratio:.2f}x over {self.pairs} pairs, "
                f"but {doubt}: not emitted; the baseline is recommended. {again}")
