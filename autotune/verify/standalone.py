"""The speedup a user measures: the emitted launch.sh against the baseline's script, each
run alone on the machine, alternating (B C, C B, ...), pair after pair.

Verification's side-by-side windows (``side_by_side.speed_check``) rank candidates cheaply, a
second apart; but processes held alive and measured in one-second windows are not what a
user runs, and an interval over those windows covers the noise of one set of processes,
not the spread from one run of a script to the next. The number autotune prints comes
from here: fresh processes, started the way the user starts them, timed the way the
script times itself (its --report, after its warm-up steps).
"""
from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Protocol

from autotune.config import TrialConfig
from autotune.document.interval import Interval
from autotune.document.measures import Check, Standalone, VerifiedSpeedup
from autotune.document.stages import Stage
from autotune.errors import NotVerified
from autotune.search.trial_summary import TrialSummary
from autotune.trials import limits
from autotune.trials.progress import Progress, VerifyStep
from autotune.trials.protocol import ProgressEvent
from autotune.trials.script_report import ScriptReport
from autotune.verify import sequential
from autotune.verify.settings import Settings
from autotune.verify.speed import CandidateSpeed, ReferenceSpeed
from autotune.verify.stats import Side, ratio_interval, speedup_interval, spread

# A candidate settled slower: the median's distribution-free interval at this level lies
# below 1 (sequential.PairsRule).
STANDALONE_CONFIDENCE = 0.9
# The printed interval: where a re-measurement of as many pairs lands, and the figure it
# stays above, at this level (stats.speedup_interval).
RERUN_LEVEL = 0.95
# Pairs whose highest ratio passes their lowest by more than this: the machine changed
# speed while it was measured. On a shared machine a configuration's speed can step
# (other tenants, power or thermal limits) and stay there for minutes, which stretches
# the pairs far beyond their usual run-to-run spread (BENCHMARKS.md).
UNSTEADY_SPREAD = 1.3


def script_timeout_s(least_s: float, measured: Iterable[TrialSummary], *, seconds: float) -> float:
    """The limit of one standalone run of a script: ``least_s`` (``Settings.script_timeout_s``),
    or, where a configuration whose script may run alone (``measured``: the search's trial
    results, ``TrialResult.summary``) measured a long one-time cost (compiling), the limit
    ``limits.run_limit_s`` gives the slowest: its one-time cost, then the rest of its trial
    and ``seconds`` of timed training."""
    runs = [(r.one_time_s, r.wall_s or 0.0) for r in measured if r.one_time_s]
    limit = limits.slowest_limit_s(least_s, runs, more_s=seconds)
    return least_s if limit is None else limit


class ScriptRun(Protocol):
    """A standalone run started ahead of its turn: set up, waiting to train."""

    def finish(self) -> ScriptReport:
        """Let it train now, alone, and wait for its report; RuntimeError where it failed."""
        ...

    def cancel(self) -> None: ...


class ScriptRunner(Protocol):
    def run_script(self, launcher: Path, *, steps: int, workdir: Path,
                   timeout_s: float) -> ScriptReport: ...
    def start_script(self, launcher: Path, *, steps: int, workdir: Path,
                     timeout_s: float) -> ScriptRun: ...


@dataclasses.dataclass(frozen=True)
class Script:
    """One side of a pair: an emitted launcher, its configuration and the rate it was
    measured at (which sizes its runs)."""

    launcher: Path
    config: TrialConfig
    expected_samples_per_s: float

    def steps(self, seconds: float) -> int:
        """Steps for about ``seconds`` of timed training after the script's 3 warm-up
        steps, and at least 10 timed."""
        per_step = self.config.batch_size / max(self.expected_samples_per_s, 1e-9)
        return 3 + max(10, int(seconds / per_step))


class ScriptFailed(RuntimeError):
    def __init__(self, role: str, message: str) -> None:
        super().__init__(message)
        self.role = role


@dataclasses.dataclass
class Pairs:
    """Rates of alternating standalone runs, pair by pair, and what they cost; ``cap``
    the most pairs asked for, ``stopped`` why they ended before it."""

    baseline: list[float]
    candidate: list[float]
    wall_s: float
    seconds_per_run: float
    cap: int = 0
    stopped: str | None = None
    candidate_peak_mb: list[float] = dataclasses.field(default_factory=list)  # its busiest rank's, per run

    @property
    def ratios(self) -> list[float]:
        return [c / b for c, b in zip(self.candidate, self.baseline)]


def alternate(runner: ScriptRunner, *, baseline: Script, candidate: Script, pairs: int,
              seconds: float, workdir: Path, timeout_s: float, ahead: int = 0,
              until: Callable[[Pairs], str | None] = lambda done: None,
              progress: Callable[[str, int], None] = lambda text, pair: None) -> Pairs:
    """Up to ``pairs`` pairs of runs, each measuring alone on the machine; within a pair the
    order alternates so that neither side always runs second. With ``ahead``, that many of
    the next runs start and set up while the current one trains, each training once the
    one before it has ended (``overlap.ahead`` says how many may). After each pair,
    ``until`` may end them (it returns why). Raises ScriptFailed naming the side whose run
    failed."""
    started = time.monotonic()
    done = Pairs(baseline=[], candidate=[], wall_s=0.0, seconds_per_run=seconds, cap=pairs)
    rates = {"baseline": done.baseline, "candidate": done.candidate}
    scripts = {"baseline": baseline, "candidate": candidate}
    turns = [(i, role) for i in range(pairs)
             for role in (("baseline", "candidate") if i % 2 == 0 else ("candidate", "baseline"))]

    def start(turn: int) -> ScriptRun:
        i, role = turns[turn]
        script = scripts[role]
        return runner.start_script(script.launcher, steps=script.steps(seconds),
                                   workdir=workdir / f"{role}-{i}", timeout_s=timeout_s)

    waiting: list[ScriptRun] = []  # started, setting up or set up, in their turns' order
    try:
        for turn, (i, role) in enumerate(turns):
            if turn % 2 == 0:
                progress(f"standalone pair {i + 1} (at most {pairs}): the emitted script and the "
                         "baseline's, each alone" + (", the next ones setting up meanwhile" if ahead else ""), i + 1)
            script = scripts[role]
            try:
                if ahead:
                    current = waiting.pop(0) if waiting else start(turn)
                    while len(waiting) < ahead and turn + 1 + len(waiting) < len(turns):
                        waiting.append(start(turn + 1 + len(waiting)))
                    report = current.finish()
                else:
                    report = runner.run_script(script.launcher, steps=script.steps(seconds),
                                               workdir=workdir / f"{role}-{i}", timeout_s=timeout_s)
            except RuntimeError as exc:
                raise ScriptFailed(role, str(exc)) from exc
            rate = report.samples_per_s
            if not rate:
                raise ScriptFailed(role, f"{script.launcher} reported no throughput")
            rates[role].append(float(rate))
            if role == "candidate" and report.rank_peak_mb is not None:
                done.candidate_peak_mb.append(report.rank_peak_mb)
            if turn % 2 == 1:
                done.wall_s = time.monotonic() - started
                done.stopped = until(done)
                if done.stopped:
                    break
    finally:
        for run in waiting:
            run.cancel()
    return done


def speed_shift(baseline: Side, candidate: Side) -> str | None:
    """A sentence naming a side that ran at two speeds from one run to the next, stepped from
    one speed to another, or drifted over the pairs (``stats.speedup_interval`` read them);
    None where neither did."""
    said = []
    for name, side in (("the baseline", baseline), ("the emitted script", candidate)):
        if side.step is not None:
            said.append(f"{name}'s speed stepped from about {side.step[0]:,.0f} to {side.step[1]:,.0f} "
                        "samples/s over the pairs")
        elif side.two_speeds:
            slow, fast = side.runs
            said.append(f"{name} ran at two speeds, about {side.speeds[0]:,.0f} and {side.speeds[1]:,.0f} "
                        f"samples/s ({slow} and {fast} of its runs), from one run to the next")
        if side.drift is not None:
            said.append(f"{name}'s speed drifted from {side.drift[0]:,.0f} to {side.drift[1]:,.0f} "
                        "samples/s over the pairs")
    if not said:
        return None
    either = any(s.two_speeds for s in (baseline, candidate))
    return ("; ".join(said) + ": the interval " + ("covers a re-run at either speed" if either
                                                   else "is widened for it")
            + ", but a re-run may find this machine in yet another state")


def check(runner: ScriptRunner, *, baseline: Script, candidate: Script, served: CandidateSpeed,
          served_baseline: ReferenceSpeed, settings: Settings, workdir: Path,
          progress: Progress) -> Check:
    """The emitted launch.sh against the baseline's script, each run alone, alternating
    (``alternate``; on a GPU node with cores and memory to spare the next runs set up while
    one trains, ``overlap.ahead``). It must run, and the figure a re-run stays above
    (``stats.speedup_interval``, at ``RERUN_LEVEL``) must be over 1x: that figure, the
    median and the interval a re-run lands in are the speedup autotune prints. ``served``
    and ``served_baseline`` are the side-by-side measurements, kept beside the standalone
    ones: their quotient is how far the cheap ranking strayed. The pairs stop once the
    figure is settled (``sequential.PairsRule``); under --timeout they stop, never below
    the fewest, when the next pair would overrun."""
    rule = sequential.PairsRule(cap=settings.pairs, level=RERUN_LEVEL, confidence=STANDALONE_CONFIDENCE)
    budget = settings.budget
    began = budget.clock() if budget is not None else 0.0

    def until(done: Pairs) -> str | None:
        n = len(done.ratios)
        settled = rule.after_pair(done.baseline, done.candidate)
        # the next pair taken to be as long as those so far
        if (settled is None and budget is not None and n >= rule.fewest
                and budget.left() < (budget.clock() - began) / n):
            return f"the next pair would overrun, stopped {budget.why}"
        return settled

    together = settings.ahead([baseline.config, candidate.config])
    try:
        pairs = alternate(
            runner, baseline=baseline, candidate=candidate, pairs=rule.limit,
            seconds=settings.pair_seconds, workdir=workdir,
            timeout_s=settings.script_timeout_s, ahead=together,
            until=until, progress=lambda text, pair: progress(
                ProgressEvent.STEP, VerifyStep(text, stage=Stage.STANDALONE.value, step=pair, of=rule.limit)))
    except ScriptFailed as exc:
        if exc.role == "baseline":
            raise NotVerified(
                f"the baseline's script ({baseline.launcher}) failed when run alone, after the "
                f"baseline ran in the search and side by side: nothing can be compared with it. "
                f"{exc}") from exc
        return Check(False, {"reason": f"the generated script failed: {exc}"})
    ratios = pairs.ratios
    of_median = ratio_interval(ratios, confidence=STANDALONE_CONFIDENCE)
    median = of_median.ratio
    rerun = speedup_interval(pairs.baseline, pairs.candidate, level=RERUN_LEVEL)
    alone, base_alone = statistics.median(pairs.candidate), statistics.median(pairs.baseline)
    unsteady = None
    if spread(ratios) > UNSTEADY_SPREAD:
        unsteady = (
            f"the pairs ranged from {min(ratios):.2f}x to {max(ratios):.2f}x: this machine's speed "
            "changed while it was measured (other tenants, power or thermal limits); the figure "
            "may not hold - run `autotune verify` on the output folder later to measure it again")
    figures = Standalone(
        speedup=VerifiedSpeedup(
            interval=Interval(ratio=median, low=rerun.interval.low, high=rerun.interval.high, level=RERUN_LEVEL),
            lower_bound=rerun.lower,
            median_interval=dataclasses.replace(of_median, rounds=None), pairs=len(ratios),
            seconds_per_run=pairs.seconds_per_run, wall_s=round(pairs.wall_s, 1),
            side_by_side=dataclasses.replace(served.interval, rounds=None),
            unsteady=unsteady,
            speed_shift=speed_shift(rerun.baseline, rerun.candidate)),
        ratios=tuple(ratios), samples_per_s=tuple(pairs.candidate), median_samples_per_s=alone,
        baseline_samples_per_s=tuple(pairs.baseline), baseline_median_samples_per_s=base_alone,
        served_over_alone={"candidate": served.median_samples_per_s / alone,
                           "baseline": served_baseline.median_samples_per_s / base_alone},
        cap=settings.pairs, stopped=pairs.stopped,
        peak_mb=max(pairs.candidate_peak_mb) if pairs.candidate_peak_mb else None,
        overlapped=together > 0)
    detail = figures.to_json()
    within = f"{rerun.interval.low:.2f}-{rerun.interval.high:.2f}x"
    if rerun.lower <= 1.0:
        detail["reason"] = (
            f"faster by a median of {median:.2f}x over {len(ratios)} pairs, but a re-run may be slower on "
            f"this machine ({within}, {RERUN_LEVEL:.0%} of re-runs)"
            if median > 1.0 else
            f"not faster when run alone: the generated script against the baseline's, {median:.2f}x over "
            f"{len(ratios)} pairs ({RERUN_LEVEL:.0%} of re-runs within {within})")
        return Check(False, detail)
    return Check(True, detail)
