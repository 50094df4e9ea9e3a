"""When a verification stage knows enough to stop: the sequential rules.

Each stage measures round after round (the speed check and the ablation: side-by-side
rounds, ``autotune.verify.side_by_side``; the standalone check: pairs of runs,
``autotune.verify.standalone``) up to its cap (``--rounds``, ``--pairs``), and stops
earlier once the decision it exists for is settled:

- the speed check (``Ranking``): a candidate clearly slower than the leader is measured
  no more; the check ends once every remaining candidate's verdict against the baseline
  is settled and the leader is clear, or no other candidate can be ``ALIKE`` faster;
- the ablation (``Effects``): each knob's effect is measured until it is settled;
- the standalone pairs (``PairsRule``): once the figure a re-run stays above clears 1 with
  a margin, or cannot clear it; where it has not cleared 1 at the cap but still could,
  more pairs, up to a limit.

A side-by-side decision is settled when its distribution-free interval (``stats.ratio_interval``, at
``CONFIDENCE``) lies wholly above or wholly below 1. Nothing stops before ``FEWEST``
rounds: with fewer, the median's interval cannot reach its confidence at all (the lowest
to the highest of n ratios covers the median with probability 1 - 2 * 0.5**n). Looking
after every round rather than once makes a wrong early stop a little likelier than the
level says; at ``FEWEST`` rounds an interval excludes 1 only when every ratio lies on one
side of it, which keeps that small.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Collection, Sequence
from typing import Protocol

from autotune.document.interval import Interval
from autotune.verify.stats import ratio_interval, speedup_interval

CONFIDENCE = 0.9
# Candidates this close are alike for the ranking: once none can be this much faster than
# the leader, more rounds would only order them within the machine's noise (the ablation
# likewise drops a knob worth less than this).
ALIKE = 1.05


def fewest(confidence: float = CONFIDENCE) -> int:
    """The fewest ratios whose lowest-to-highest interval covers their median with
    probability ``confidence`` (sign test): 5 at 90%."""
    n = 1
    while 1 - 2 * 0.5 ** n < confidence:
        n += 1
    return n


FEWEST = fewest()


def settled(interval: Interval) -> bool:
    """Whether a ratio's interval decides it: wholly above 1 or wholly below."""
    return interval.low > 1.0 or interval.high < 1.0


def describe(interval: Interval) -> str:
    return (f"{interval.ratio:.2f}x ({interval.level:.0%} interval "
            f"{interval.low:.2f}-{interval.high:.2f}x)")


def _over(values: Sequence[float], reference: Sequence[float]) -> list[float]:
    """Round by round: measurements of one round only are paired."""
    return [v / r for v, r in zip(values, reference)]


@dataclasses.dataclass
class Decision:
    """After a round: the configurations to measure no more, each with why, and why the
    whole measurement ends now (None: it goes on)."""

    stop: dict[int, str] = dataclasses.field(default_factory=dict)
    done: str | None = None


class Rule(Protocol):
    def after_round(self, values: Sequence[Sequence[float]], active: Collection[int]) -> Decision:
        """``values[i]``: configuration i's rate in each round so far, the reference's
        (``values[0]``) in every one; ``active``: the others still measured (each has a
        rate in every round)."""
        ...


@dataclasses.dataclass(frozen=True)
class Ranking:
    """The verification's speed check: the baseline first, the candidates after it. The
    leader is the candidate with the highest median ratio over the baseline."""

    fewest: int = FEWEST

    def after_round(self, values: Sequence[Sequence[float]], active: Collection[int]) -> Decision:
        rounds = len(values[0])
        if rounds < self.fewest:
            return Decision()
        if not active:
            return Decision(done="no candidate is left to measure")
        against_base = {i: ratio_interval(_over(values[i], values[0]), confidence=CONFIDENCE)
                        for i in active}
        leader = max(active, key=lambda i: against_base[i].ratio)
        stop = {}
        for i in active:
            if i == leader:
                continue
            against = ratio_interval(_over(values[i], values[leader]), confidence=CONFIDENCE)
            if against.high < 1.0:
                stop[i] = (f"clearly slower than the leader after {rounds} rounds: "
                           f"{describe(against)} of its speed")
        remaining = [i for i in active if i not in stop]
        if len(remaining) == 1 and settled(against_base[leader]):
            return Decision(stop, done="the leader is clear and every verdict against the baseline settled")
        if all(settled(against_base[i]) for i in remaining) and all(
                ratio_interval(_over(values[i], values[leader]), confidence=CONFIDENCE).high < ALIKE
                for i in remaining if i != leader):
            return Decision(stop, done=f"every verdict against the baseline settled, and no other candidate "
                                       f"is shown to be {ALIKE - 1:.0%} faster than the leader")
        return Decision(stop)


@dataclasses.dataclass(frozen=True)
class Effects:
    """The ablation: the winner first; ``deciding`` are the leave-one-out variants (each
    one's ratio to the winner decides a knob); ``kept`` the configurations the path needs
    (the baseline and the path's steps): they are measured as long as the session goes on,
    since the path's steps multiply to the whole only over rounds they all share."""

    deciding: frozenset[int]
    kept: frozenset[int] = frozenset()
    fewest: int = FEWEST

    def after_round(self, values: Sequence[Sequence[float]], active: Collection[int]) -> Decision:
        rounds = len(values[0])
        if rounds < self.fewest or not self.deciding:
            return Decision()
        stop, open_ = {}, 0
        for i in self.deciding & set(active):
            effect = ratio_interval([1 / r for r in _over(values[i], values[0])], confidence=CONFIDENCE)
            if not settled(effect):
                open_ += 1
            elif i not in self.kept:
                stop[i] = f"settled after {rounds} rounds: {describe(effect)}"
        return Decision(stop, done=None if open_ else "every knob's effect settled")


# The fewest standalone pairs: fewer, and the t quantile of the printed figure is so wide
# (df 1) that only a configuration several times faster could clear 1.
PAIRS_FEWEST = 3
# The printed figure (the one a re-run stays above) is settled once it clears 1 by this
# much: a figure just above 1 could fall below it with the next pair.
PAIRS_MARGIN = 1.05
# Where the figure has not cleared 1 at --pairs but more pairs could still carry it over,
# pairs go on up to this many times --pairs.
PAIRS_EXTEND = 2


@dataclasses.dataclass(frozen=True)
class PairsRule:
    """The standalone pairs. The candidate passes when the figure a re-run stays above
    (``stats.speedup_interval``'s ``lower``, at ``level``) is above 1. From ``fewest`` pairs
    on, they stop once the figure clears 1 by ``PAIRS_MARGIN``; from ``FEWEST`` on, also once
    the median's distribution-free interval (at ``confidence``) lies below 1, or the figure
    cannot clear 1 even at ``limit`` pairs spread as these were. At ``cap`` (--pairs) a
    figure that clears 1 stops them; one that does not but could goes on to ``limit``.

    Stopping once the figure clears is safe where a pass ran to the cap was not: the figure
    is the t interval of the pairs measured, with the drift between sessions added, so
    three pairs that happen to agree still print a wide figure, never a narrow one."""

    cap: int
    level: float = 0.95
    confidence: float = CONFIDENCE
    fewest: int = PAIRS_FEWEST

    @property
    def limit(self) -> int:
        return PAIRS_EXTEND * self.cap

    def after_pair(self, baseline: Sequence[float], candidate: Sequence[float]) -> str | None:
        """Why the pairs stop after these rates (one of each side a pair); None: go on."""
        n = len(candidate)
        if n < min(self.fewest, self.cap):
            return None
        figure = speedup_interval(baseline, candidate, level=self.level)
        if figure.lower > PAIRS_MARGIN:
            return f"settled after {n} pairs: a re-run stays above {figure.lower:.2f}x"
        # a failure is called no sooner than a side-by-side one: three pairs' spread says
        # too little of the next ones'
        if n >= FEWEST:
            decided = ratio_interval(_over(candidate, baseline), confidence=self.confidence)
            if decided.high < 1.0:
                return f"not faster alone, settled after {n} pairs: {describe(decided)}"
            if figure.lower_after(self.limit) <= 1.0:
                return (f"cannot clear 1x: after {n} pairs a re-run stays above {figure.lower:.2f}x, and "
                        f"{self.limit} pairs spread as these would not carry it over 1x")
        if n >= self.cap and figure.lower > 1.0:
            return f"cleared 1x at {n} pairs: a re-run stays above {figure.lower:.2f}x"
        if n >= self.limit:
            return f"not settled after {n} pairs: a re-run stays above {figure.lower:.2f}x"
        return None
