"""How long a compiled run may take before it is killed.

A run's one-time cost (``TrialResult.one_time_s``) is mostly torch.compile where it
compiles: tens of seconds for the default mode, minutes for max-autotune on a real model
on an H100. A fixed limit (--trial-timeout, a standalone script's 300 s) kills such a run
while it compiles, every time, and the mode is never measured; a limit as long as the
slowest compile everywhere would let a hung uncompiled run hang that long.
"""
from __future__ import annotations

from collections.abc import Iterable

# What was measured once may take this many times as long again: a colder compile cache, a
# busier machine, a model compiled at another batch size.
COMPILE_MARGIN = 3.0


def run_limit_s(least_s: float, *, one_time_s: float | None, measuring_s: float = 0.0) -> float:
    """The limit of a run like one measured to cost ``one_time_s`` once (None: nothing
    measured) and ``measuring_s`` after it: ``least_s``, or ``COMPILE_MARGIN`` times its
    one-time cost plus its measuring where that is longer."""
    if not one_time_s:
        return least_s
    return max(least_s, COMPILE_MARGIN * one_time_s + max(0.0, measuring_s))


def slowest_limit_s(least_s: float, runs: Iterable[tuple[float, float]], *, more_s: float = 0.0) -> float | None:
    """``run_limit_s`` for the slowest of ``runs`` measured (one-time cost, wall time each),
    with ``more_s`` beyond its wall time; None where none was measured."""
    measured = list(runs)
    if not measured:
        return None
    once, wall = max(measured)
    return run_limit_s(least_s, one_time_s=once, measuring_s=max(0.0, wall - once) + more_s)
