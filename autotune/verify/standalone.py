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
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from autotune.config import TrialConfig


class ScriptRunner(Protocol):
    def run_script(self, launcher: Path, *, steps: int, workdir: Path,
                   timeout_s: float) -> dict[str, Any]: ...


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
    """Rates of alternating standalone runs, pair by pair, and what they cost."""

    baseline: list[float]
    candidate: list[float]
    wall_s: float
    seconds_per_run: float

    @property
    def ratios(self) -> list[float]:
        return [c / b for c, b in zip(self.candidate, self.baseline)]


def alternate(runner: ScriptRunner, *, baseline: Script, candidate: Script, pairs: int,
              seconds: float, workdir: Path, timeout_s: float,
              progress: Callable[[str], None] = lambda text: None) -> Pairs:
    """``pairs`` pairs of runs, each alone on the machine; within a pair the order
    alternates so that neither side always runs second. Raises ScriptFailed naming the
    side whose run failed."""
    started = time.monotonic()
    rates: dict[str, list[float]] = {"baseline": [], "candidate": []}
    scripts = {"baseline": baseline, "candidate": candidate}
    for i in range(pairs):
        progress(f"standalone pair {i + 1}/{pairs}: the emitted script and the baseline's, "
                 "each alone")
        for role in (("baseline", "candidate") if i % 2 == 0 else ("candidate", "baseline")):
            script = scripts[role]
            try:
                report = runner.run_script(script.launcher, steps=script.steps(seconds),
                                           workdir=workdir / f"{role}-{i}", timeout_s=timeout_s)
            except RuntimeError as exc:
                raise ScriptFailed(role, str(exc)) from exc
            rate = report.get("samples_per_s")
            if not rate:
                raise ScriptFailed(role, f"{script.launcher} reported no throughput")
            rates[role].append(float(rate))
    return Pairs(baseline=rates["baseline"], candidate=rates["candidate"],
                 wall_s=time.monotonic() - started, seconds_per_run=seconds)
