"""How a tuner takes turns with the other workers of a shared study: alone (the default),
nothing to wait for."""
from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any


@dataclasses.dataclass(frozen=True)
class Turns:
    """``shared``: other workers use the study at the same time (their running trials are
    theirs, and count against the budget); ``lock``: held while the study's queue is
    decided (one worker at a time); ``measuring``: held while a trial measures (one
    measurement per machine)."""

    shared: bool = False
    lock: Callable[[], AbstractContextManager[Any]] = contextlib.nullcontext
    measuring: Callable[[], AbstractContextManager[Any]] = contextlib.nullcontext


def once(say: Callable[[str], None]) -> Callable[[str], None]:
    """``say``, for the first message only: the workers of a shared study on one machine
    wait for each other at every trial."""
    said: list[str] = []

    def first(text: str) -> None:
        if not said:
            said.append(text)
            say(text)
    return first
