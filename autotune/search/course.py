"""How the tuner goes about a search (``search.tuner``), the parts of it built once from
the run's search section and its study: when it stops, where it starts, what a trial is
worth, and how it takes turns with a shared study's other workers."""
from __future__ import annotations

import dataclasses

from autotune.config import TrialConfig
from autotune.search.budget import SearchBudget
from autotune.search.scoring import Scoring
from autotune.search.turns import Turns


@dataclasses.dataclass(frozen=True)
class Starts:
    """Where the search starts besides the user's configuration (``search.queued``):
    ``heuristics``, the machine's start points; ``fastest_batch``, the batch range's fastest
    (``search.batch_range``)."""

    heuristics: list[TrialConfig] = dataclasses.field(default_factory=list)
    fastest_batch: int | None = None


@dataclasses.dataclass(frozen=True)
class Course:
    """The search's ``budget``; its ``starts``; ``scoring``, how a trial's result is valued
    (steady throughput, or a planned run's time; the memory a rank may hold); ``turns``,
    how it shares the study with other workers (alone by default); ``steers``, whether the
    leader's step is profiled to choose trials (``search.steering``: not a script's, whose
    step runs inside its own training)."""

    budget: SearchBudget
    starts: Starts = Starts()
    scoring: Scoring = Scoring()
    turns: Turns = Turns()
    steers: bool = True
