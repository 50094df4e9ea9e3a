"""When the search starts no more trials: its budget of trials, its share of --timeout, and
what comes after it (verification under --timeout: ``verify.reserve``)."""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Protocol

from autotune.options import SEARCH_SHARE
from autotune.search.memory import MemoryLimit
from autotune.search.outcome import SearchOutcome
from autotune.space import Space


def search_timeout(timeout_s: float | None) -> float | None:
    """The search's part of ``--timeout``; None without one."""
    return None if timeout_s is None else SEARCH_SHARE * timeout_s


class Reserve(Protocol):
    """What comes after the search keeps of --timeout (``verify.reserve.Reserve``): see
    ``SearchBudget.enough`` and ``SearchBudget.room_s``."""

    def enough(self, outcome: SearchOutcome) -> str | None: ...

    def room_s(self, outcome: SearchOutcome, once_s: float) -> float: ...


class Reserving(Protocol):
    """What makes the ``Reserve`` for the space the search settled, what a rank may hold, and
    when --timeout ends the run (``verify.reserve.leave_for_verification``, given by the
    pipeline: the search does not price verification itself)."""

    def __call__(self, *, space: Space, limit: MemoryLimit, ends_at: float,
                 fresh_start: tuple[float, float] | None = None) -> Reserve: ...


@dataclasses.dataclass(frozen=True)
class SearchBudget:
    """``trials``: how many trials the search measures (in a shared study, those other
    workers are measuring count); ``timeout_s``: after how long from ``started_at`` (epoch
    seconds; default: when the budget is made) it starts none; ``enough(outcome so far)``:
    why no more trial may start (what comes after the search needs the rest of --timeout),
    or None; ``room_s(outcome so far, one-time seconds)``: what is left of --timeout after
    what comes after the search at its least."""

    trials: int
    timeout_s: float | None = None
    started_at: float = dataclasses.field(default_factory=time.time)
    enough: Callable[[SearchOutcome], str | None] | None = None
    # the seconds left of the whole run once what comes after the search is kept, were a
    # configuration paying a one-time cost of so many seconds to win (None: no bound)
    room_s: Callable[[SearchOutcome, float], float] | None = None

    def elapsed_s(self) -> float:
        return time.time() - self.started_at

    def left_s(self) -> float | None:
        """What is left of ``timeout_s``; None without one."""
        return None if self.timeout_s is None else self.timeout_s - self.elapsed_s()

    def room_left_s(self, outcome: Callable[[], SearchOutcome], *, once_s: float) -> float | None:
        """What is left of the whole run for a trial that pays ``once_s`` once (``room_s``),
        else of ``timeout_s``; None without either."""
        return self.room_s(outcome(), once_s) if self.room_s is not None else self.left_s()

    def spent(self, outcome: Callable[[], SearchOutcome]) -> str | None:
        """Why no new trial starts, by the clock or by what comes after the search (asked
        with ``outcome()``, the search's outcome so far); None if one may."""
        if self.timeout_s is not None and self.elapsed_s() > self.timeout_s:
            return f"--timeout {self.timeout_s:.0f} s reached"
        if self.enough is not None and (why := self.enough(outcome())):
            return why
        return None
