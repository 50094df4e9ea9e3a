"""The run as it goes, on a terminal: one live panel (rich's ``Live``) in place of the lines a
log gets. It says the stage, the step within it, the configuration measured now, the best so
far against the baseline, the time spent and the time left.

The time left comes from the prices the run already keeps: in the search, the trials left at
the mean length of those so far; in verification, what ``verify.fit.estimate`` priced each
of its stages at (the estimate ``--timeout`` is fitted with), the stage under way counted
down from when it began; under ``--timeout``, never past its end. Before the search has timed
a trial nothing is known, and the panel says so rather than guess.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from rich.console import Console, Group
from rich.live import Live
from rich.text import Text

from autotune.task.objective import duration

VERIFY_NAMES = {"gates": "verify: numerics and quality", "speed": "verify: speed side by side",
                "ablation": "verify: what each knob is worth", "standalone": "verify: standalone pairs"}


class LiveView:
    """The panel, and what it shows; its setters are called by ``console.Reporter``. Rich
    redraws it a few times a second from a thread of its own, reading these fields."""

    def __init__(self, console: Console, *, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.started = clock()
        self.ends_at: float | None = None  # the run's --timeout, as an epoch time
        self.stage = "starting"
        self.step = ""
        self.now = ""  # the configuration measured now, and its last window
        self.best = ""  # the best so far against the baseline
        self.latest = ""  # the last thing the run said
        self.failed = 0
        self._trials: tuple[int, int] | None = None  # trials started, of how many
        self._trial_starts: list[float] = []
        self._verify: dict[str, float] = {}  # verification's stages and their estimates
        self._verify_stage: str | None = None
        self._verify_began: dict[str, float] = {}  # when each of them first began
        self._live = Live(self, console=console, transient=True, refresh_per_second=4,
                          redirect_stdout=False, redirect_stderr=False)
        self._live.start()

    def stop(self) -> None:
        self._live.stop()

    def enter(self, stage: str, *, step: str = "") -> None:
        if stage != self.stage:
            self.stage, self.now = stage, ""
        self.step = step

    def trial(self, number: int, of: int, config: str) -> None:
        self.enter("search", step=f"trial {number} of {of}")
        self._trials = (number, of)
        self._trial_starts.append(self.clock())
        self.now = config

    def verification(self, estimate_s: Mapping[str, float]) -> None:
        self._verify = {k: v for k, v in estimate_s.items() if v > 0}
        self.enter("verify")

    def verify_stage(self, stage: str, *, step: str = "") -> None:
        if stage != self._verify_stage:
            self._verify_stage = stage
            self._verify_began.setdefault(stage, self.clock())
            self.enter(VERIFY_NAMES.get(stage, f"verify: {stage}"), step=step)
        else:
            self.step = step

    def speed_round(self, round: int, of: int) -> None:
        """A round side by side: the speed check's, or the ablation's own session's."""
        step = f"round {round} of at most {of}"
        if self._verify_stage == "ablation":
            self.step = step
        else:
            self.verify_stage("speed", step=step)

    def left_s(self) -> float | None:
        """The estimated seconds left of the run; None where nothing prices it yet."""
        now = self.clock()
        left: float | None = None
        if self.stage == "search" and self._trials and len(self._trial_starts) > 1:
            number, of = self._trials
            per_trial = (self._trial_starts[-1] - self._trial_starts[0]) / (len(self._trial_starts) - 1)
            left = max(0.0, per_trial - (now - self._trial_starts[-1])) + per_trial * (of - number)
            left += sum(self._verify.values())
        elif self._verify and self.stage.startswith("verify"):
            # a stage not begun yet counts whole; the one under way, what is left of it since
            # it first began (the gates run again for the ablation's simplified configuration)
            left = 0.0
            for stage, estimate in self._verify.items():
                began = self._verify_began.get(stage)
                if began is None:
                    left += estimate
                elif stage == self._verify_stage:
                    left += max(0.0, estimate - (now - began))
        if self.ends_at is not None:
            until_end = max(0.0, self.ends_at - now)
            left = until_end if left is None else min(left, until_end)
        return left

    def __rich__(self) -> Group:
        head = Text.assemble(("autotune ", "bold"), (self.stage, "bold cyan"))
        if self.step:
            head.append(f"  {self.step}")
        if self.now:
            head.append(f"  {self.now}", style="dim")
        elapsed = self.clock() - self.started
        left = self.left_s()
        if left is None:
            clock = f"{duration(elapsed)} elapsed, time left: known after the first trials"
        elif self.stage == "search" and not self._verify:
            clock = f"{duration(elapsed)} elapsed, about {duration(left)} left of the search, then verification"
        else:
            clock = f"{duration(elapsed)} elapsed, about {duration(left)} left"
        if self.ends_at is not None:
            clock += " (--timeout bounds it)"
        tail = Text(clock)
        if self.best:
            tail = Text.assemble((self.best, "green"), "  ", clock)
        if self.failed:
            tail.append(f"  {self.failed} failed", style="red")
        lines = [head, tail]
        if self.latest:
            lines.append(Text(self.latest, style="dim", overflow="ellipsis", no_wrap=True))
        for line in lines:
            line.no_wrap, line.overflow = True, "ellipsis"
        return Group(*lines)
