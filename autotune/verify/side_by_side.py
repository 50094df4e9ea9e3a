"""The side-by-side measurement: a reference configuration and others measured in turn,
round after round (R C1 C2, C1 C2 R, ... rotating), each round's ratio over the reference
taken seconds apart, so that drift on a shared machine cancels out.

The verification's speed check measures its candidates against the baseline this way
(``autotune.verify.gates``), and the ablation the winner's variants against the winner
(``autotune.verify.ablation``). The configurations are held alive side by side between
windows, on GPUs those whose device memory fits together (``autotune.verify.device_room``);
any other is started fresh for each of its turns (``Visits``).

Rounds go on up to the cap; a sequential rule (``autotune.verify.sequential``) may stop a
configuration, or the whole measurement, once what it decides is settled.
"""
from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Sequence
from pathlib import Path

from autotune.config import TrialConfig
from autotune.document.measures import Check
from autotune.errors import NotVerified
from autotune.runtime.knobs import Device
from autotune.trials.progress import Progress, SpeedRound, VerifyStep, no_progress
from autotune.trials.protocol import ProgressEvent
from autotune.trials.runner import LiveTrialLike, TrialRunnerLike
from autotune.trials.spec import TrialMode
from autotune.verify.device_room import DeviceRoom
from autotune.verify.sequential import FEWEST, Decision, Rule
from autotune.verify.speed import CandidateSpeed, ReferenceSpeed
from autotune.verify.stats import ratio_interval

# A configuration that cannot be held (on GPUs where it does not fit beside the others,
# or where a GPU admits one process at a time: ``device_room``) is started fresh for each
# visit, beside those held: a visit pays a start and a warm-up, so it measures several
# windows, each one round, and every configuration measures as many in that block of
# rounds.
WINDOWS_PER_VISIT = 3
# Held processes set up this many at a time on a CPU: a start is mostly an interpreter
# importing torch and the model file, on one core, and another's overlaps it. Measuring
# never does. On GPUs all set up at once and warm up one at a time (``LiveTrial.wait_ready``).
STARTING_TOGETHER = 2


def _reference_failed(failure: str | None, folder: Path) -> NotVerified:
    return NotVerified(
        f"the baseline failed while verification re-measured it ({failure}), after it ran in "
        f"the search: nothing can be compared with it. Its log: {folder / 'log.txt'}. Run the "
        "same command again to verify (the search is kept).")


def hold_within_budget(live: list[LiveTrialLike | None], failures: list[str | None],
                       budget: int | None) -> None:
    """The processes held side by side share one memory budget (what one trial may
    use): while together they use more, the largest candidate is stopped, never the
    reference. Each trial's own limit applies only while it measures."""
    if not budget:
        return
    while True:
        sizes = [t.memory() if t is not None else 0 for t in live]
        held = [i for i in range(1, len(live)) if live[i] is not None]
        if sum(sizes) <= budget or not held:
            return
        largest = max(held, key=sizes.__getitem__)
        failures[largest] = (
            f"ran out of memory: the {sum(t is not None for t in live)} configurations held "
            f"side by side used {sum(sizes) / 2**20:,.0f} MiB together, over the budget of "
            f"{budget / 2**20:,.0f} MiB; this one, the largest ({sizes[largest] / 2**20:,.0f} "
            "MiB), was stopped")
        victim = live[largest]
        if victim is not None:
            victim.kill()
        live[largest] = None


@dataclasses.dataclass(frozen=True)
class Visits:
    """How a session measures its configurations: ``held``, the indices held alive for the
    whole session (all of them on a CPU; on GPUs those ``DeviceRoom`` fits together), the
    others started fresh for each visit; ``per_visit`` windows (rounds) each configuration
    measures in turn, one when all are held; ``visits`` such turns, up to the cap."""

    held: frozenset[int]
    per_visit: int
    visits: int

    @property
    def cap(self) -> int:
        """The most rounds."""
        return self.per_visit * self.visits

    @classmethod
    def of(cls, configs: Sequence[TrialConfig], rounds: int, room: DeviceRoom | None = None) -> Visits:
        held = frozenset((room or DeviceRoom()).held_together(configs))
        if len(held) == len(configs):
            return cls(held, 1, rounds)
        # the sequential rules need FEWEST rounds before they can stop anything
        return cls(held, WINDOWS_PER_VISIT,
                   max(math.ceil(FEWEST / WINDOWS_PER_VISIT), math.ceil(rounds / WINDOWS_PER_VISIT)))


@dataclasses.dataclass
class Held:
    """Processes serving one configuration each, started ahead of a side-by-side
    measurement or kept after one for the next: verification starts the speed check's
    while the gates train (not a measurement: no window runs), and the ablation takes the
    winner and the baseline from the speed check. ``close`` ends those left."""

    runner: TrialRunnerLike
    live: dict[TrialConfig, tuple[LiveTrialLike, str]] = dataclasses.field(default_factory=dict)
    started: int = 0

    def start(self, configs: Sequence[TrialConfig]) -> None:
        for cfg in configs:
            if cfg not in self.live:
                name = f"verify-held-{self.started}"
                self.live[cfg] = self.runner.start(cfg, name=name, mode=TrialMode.serve()), name
                self.started += 1

    def take(self, cfg: TrialConfig) -> tuple[LiveTrialLike, str] | None:
        """``cfg``'s process and the name of its trial folder, no longer held here."""
        return self.live.pop(cfg, None)

    def keep(self, cfg: TrialConfig, live: LiveTrialLike, name: str) -> None:
        self.live[cfg] = live, name

    def close(self, *, keeping: Sequence[TrialConfig] = ()) -> None:
        for cfg in [c for c in self.live if c not in keeping]:
            self.live.pop(cfg)[0].kill()


@dataclasses.dataclass
class SideBySide:
    """What a side-by-side measurement measured: each configuration's rate per round (the
    reference's in every round; the others' in the rounds before they failed or were
    stopped), why each failed or was stopped, and why the whole ended before ``cap``."""

    values: list[list[float]]
    failures: list[str | None]
    stopped: list[str | None]
    cap: int
    ended: str | None = None

    def active(self) -> list[int]:
        return [i for i in range(1, len(self.values)) if not self.failures[i] and not self.stopped[i]]

    def decide(self, rule: Rule | None) -> Decision:
        """Apply ``rule`` after a round: mark the configurations it stops and the end."""
        if rule is None:
            return Decision()
        decision = rule.after_round(self.values, self.active())
        for i, why in decision.stop.items():
            self.stopped[i] = why
        self.ended = decision.done
        return decision


def measure(runner: TrialRunnerLike, configs: list[TrialConfig], *, plan: Visits,
            progress: Progress, name: str, reference_label: str,
            rule: Rule | None, held: Held | None = None) -> SideBySide:
    """Round after round, rotating, each configuration measures ``plan.per_visit``
    windows in its turn: those held (``plan.held``) in their process, the others each in
    a process started for its turn and ended after it, so that nothing else of autotune's
    runs beside the held processes. The held ones are set up before any window,
    STARTING_TOGETHER at a time on a CPU and all at once on GPUs, each warmed up alone; they
    keep within one host-memory budget (``hold_within_budget``). One the rule stops is
    ended at once. ``held``: processes started earlier are taken from it, and those held
    still measuring at the end are left in it (else ended)."""
    live: list[LiveTrialLike | None] = [None] * len(configs)
    session = SideBySide(values=[[] for _ in configs], failures=[None] * len(configs),
                      stopped=[None] * len(configs), cap=plan.cap)
    failures, values = session.failures, session.values
    budget = runner.memory_limit_bytes
    starting: list[tuple[int, LiveTrialLike]] = []
    names = [f"{name}-{i}" for i in range(len(configs))]  # the held trials' folders
    together = len(configs) if any(cfg.device == Device.CUDA for cfg in configs) else STARTING_TOGETHER

    def ready(i: int, started: LiveTrialLike) -> None:
        if started.wait_ready():
            live[i] = started
            hold_within_budget(live, failures, budget)
        else:
            failures[i] = started.result.describe_failure()

    def visit(i: int, r: int) -> list[float]:
        if i in plan.held:
            trial = live[i]
            assert trial is not None
            windows = _windows(trial, plan.per_visit)
            if len(windows) < plan.per_visit:
                live[i] = None
                failures[i] = trial.result.describe_failure()
            return windows
        if r == 0:
            progress(ProgressEvent.STEP, VerifyStep(f"measuring {_role(i, reference_label)} "
                                                    f"in a process of its own for each visit: {configs[i].short()}"))
        started = runner.start(configs[i], name=f"{name}-{i}-{r}", mode=TrialMode.serve())
        try:
            windows = _windows(started, plan.per_visit) if started.wait_ready() else []
        finally:
            started.kill()
        if len(windows) < plan.per_visit:
            failures[i] = started.result.describe_failure()
            names[i] = f"{name}-{i}-{r}"
        return windows

    try:
        taken = {i: t for i, cfg in enumerate(configs) if (t := held.take(cfg) if held else None) is not None}
        for i in [i for i in taken if i not in plan.held]:  # measured fresh here: no longer held
            taken.pop(i)[0].kill()
        if taken:
            # no new start will end the runner's idle warm processes: nothing else of ours
            # may share the machine with the windows
            runner.close()
        for i, cfg in enumerate(configs):
            if i not in plan.held:
                continue
            if i in taken:
                process, names[i] = taken[i]
                starting.append((i, process))
            else:
                progress(ProgressEvent.STEP, VerifyStep(f"starting {_role(i, reference_label)}: {cfg.short()}"))
                starting.append((i, runner.start(cfg, name=names[i], mode=TrialMode.serve())))
            if len(starting) >= together:
                ready(*starting.pop(0))
        while starting:
            ready(*starting.pop(0))
        if 0 in plan.held and live[0] is None:
            raise _reference_failed(failures[0], runner.workdir / names[0])
        for r in range(plan.visits):
            hold_within_budget(live, failures, budget)
            progress(ProgressEvent.SPEED, SpeedRound(round=r * plan.per_visit + 1, rounds=plan.cap))
            for i in _rotation(len(configs), r):
                if failures[i] or session.stopped[i]:
                    continue
                windows = visit(i, r)
                if len(windows) < plan.per_visit:
                    if i == 0:
                        raise _reference_failed(failures[0], runner.workdir / names[0])
                    continue
                values[i].extend(windows)
            for i in session.decide(rule).stop:
                stopped = live[i]
                if stopped is not None:
                    stopped.kill()
                live[i] = None
            if session.ended:
                break
        if held is not None:
            for i, cfg in enumerate(configs):
                trial = live[i]
                if trial is not None:
                    held.keep(cfg, trial, names[i])
                    live[i] = None
    finally:
        for trial in [*live, *(t for _, t in starting)]:
            if trial is not None:
                trial.kill()
    return session


def _windows(trial: LiveTrialLike, count: int) -> list[float]:
    """Up to ``count`` windows of ``trial``, fewer where it fails."""
    out: list[float] = []
    for _ in range(count):
        value = trial.window()
        if value is None:
            break
        out.append(value)
    return out


def _role(i: int, reference_label: str) -> str:
    return reference_label if i == 0 else f"candidate {i}"


def _rotation(n: int, r: int) -> list[int]:
    """Round ``r``'s order: R C1 C2, C1 C2 R, ... so no configuration is always first."""
    shift = r % n
    return list(range(n))[shift:] + list(range(n))[:shift]


def speed_check(
    runner: TrialRunnerLike, reference: TrialConfig, others: list[TrialConfig], *,
    rounds: int, progress: Progress = no_progress, name: str = "verify-speed",
    reference_label: str = "baseline", rule: Rule | None = None, held: Held | None = None,
    room: DeviceRoom | None = None,
) -> tuple[ReferenceSpeed, list[Check]]:
    """``reference`` and ``others`` measured in turn, round after round, up to ``rounds``
    (``rule`` may stop a configuration or the whole earlier); per other, a check that
    passes when its ratios over the reference's windows show it faster. Returns the
    reference's speed (``ReferenceSpeed``: its rates, the rounds run, the cap and why it
    ended before the cap), and the checks, whose figures are a ``CandidateSpeed``'s (a
    configuration the rule stopped says why in ``stopped``). ``name`` names the trials' folders;
    ``reference_label`` is what progress calls the reference (the ratios' denominator).
    ``held``: processes to take and leave (``Held``); ``room``: what may be held on the
    GPUs (``device_room``; without it, every GPU configuration is visited fresh).
    Raises NotVerified when the reference fails: nothing can be compared with it."""
    configs = [reference, *others]
    session = measure(runner, configs, plan=Visits.of(configs, rounds, room), progress=progress, name=name,
                      reference_label=reference_label, rule=rule, held=held)
    values, failures = session.values, session.failures
    base_values = values[0]
    checks = []
    for i in range(1, len(configs)):
        if failures[i]:
            checks.append(Check(False, {"reason": f"failed when re-measured: {failures[i]}"}))
            continue
        ratios = [v / b for v, b in zip(values[i], base_values)]
        stats = ratio_interval(ratios)
        passed = stats.low > 1.0
        stopped = session.stopped[i] or None
        reason = None if passed else (
            f"not faster than the baseline: speedup {stats.ratio:.2f}x, "
            f"{stats.level:.0%} interval {stats.low:.2f}-{stats.high:.2f}x "
            "includes 1.0" + (f" (measured no more: {stopped})" if stopped else ""))
        speed = CandidateSpeed(interval=stats, ratios=tuple(ratios), samples_per_s=tuple(values[i]),
                               median_samples_per_s=statistics.median(values[i]), stopped=stopped, reason=reason)
        checks.append(Check(passed, speed.to_json()))
    reference_speed = ReferenceSpeed(
        samples_per_s=tuple(base_values), median_samples_per_s=statistics.median(base_values),
        rounds=len(base_values), cap=session.cap,
        stopped=session.ended if session.ended and len(base_values) < session.cap else None)
    return reference_speed, checks


def relative_to_level(rates: Sequence[Sequence[float]], *,
                      beside: Sequence[Sequence[float]] = ()) -> list[float]:
    """Per configuration, the median over rounds of its rate over the round's level (the
    geometric mean of all their rates in that round): configurations close to each other
    are told apart by windows taken seconds apart, and one noisy reference window no
    longer moves them all. ``beside``: configurations measured in fewer of those rounds
    (stopped early), each over the same level in the rounds it was measured in; listed
    after ``rates``', and all of them then taken over the level of every configuration
    (from their medians), as when each was measured in every round."""
    rounds = min(len(r) for r in rates)
    level = [math.exp(statistics.fmean(math.log(max(r[t], 1e-9)) for r in rates))
             for t in range(rounds)]
    relative = [statistics.median(r[t] / level[t] for t in range(min(len(r), rounds)))
                for r in [*rates, *beside]]
    if not beside:
        return relative

    def geometric(group: Sequence[Sequence[float]]) -> float:
        return math.exp(statistics.fmean(math.log(max(statistics.median(r), 1e-9)) for r in group))

    scale = geometric(rates) / geometric([*rates, *beside])
    return [r * scale for r in relative]
