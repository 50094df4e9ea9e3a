"""The measuring harness that a run (``autotune.pipeline``) and a re-verification
(``autotune.reverify``) both set up: this machine's probe and the trial runner for a task
on it (the emitted scripts of a configuration under test: ``emit.outputs.candidate_emitter``)."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from autotune.probes import Machine
from autotune.sections import MeasureOptions
from autotune.task import Task
from autotune.trials import forkserver
from autotune.trials.protocol import Measurement
from autotune.trials.runner import TrialRunner


def memory_limit(machine: Machine) -> int | None:
    """A trial may use most of what is free, never all: the kernel's OOM killer must
    never have to choose (it might choose the tuner or the user's desktop)."""
    usable = machine.memory.usable_bytes
    return int(usable * 0.8) if usable else None


def setup_hang_limit(task: Task) -> float:
    """How long a trial may take to set up before it counts as hung: the contract check
    did the same work (import, build_dataset, build_model) and one step on two items, so
    several times its time, and at least a minute (starting ranks, DataLoader workers, a full
    first batch come on top)."""
    return max(60.0, 5 * task.check_s)


# In the output folder: torch.compile's cache, shared by the run's processes (and a resumed
# run's): a configuration compiled once compiles from it in verification and the scripts.
COMPILE_CACHE = "compile-cache"


def make_runner(task: Task, machine: Machine, out: Path, measure: MeasureOptions) -> TrialRunner:
    """The trial runner for ``task`` on ``machine``, its trials under ``out``/trials, measuring
    as the run's measurement section says (a re-verification takes the same section). It takes
    over the warm interpreter that ``task``'s check started (``forkserver.shared``): the trials
    whose environment is the check's fork from it rather than import torch again (about 3
    CPU-seconds); the rest are ended, as idle they would hold their memory through the run."""
    runner = TrialRunner(
        model_file=task.path, machine=machine, workdir=out / "trials",
        measurement=Measurement(window_s=measure.window_s, windows=measure.windows),
        timeout_s=measure.trial_timeout_s, hang_s=measure.hang_timeout_s, setup_hang_s=setup_hang_limit(task),
        memory_limit_bytes=memory_limit(machine), warm=measure.warm, compile_cache=out / COMPILE_CACHE,
        script=task.script,
    )
    checked = forkserver.shared()
    if runner.forks is not None:
        runner.forks.adopt(checked)
    checked.close()
    return runner


def waiting_notice(warn: Callable[[str], None]) -> Callable[[str], None]:
    """The measurement lock's notice (``measure_lock.held``) for a run about to wait for
    another on this machine: the check's warm interpreter (``make_runner``) is ended first, as
    idle it would hold its memory through the wait; then ``warn`` says why it waits."""
    def waiting(text: str) -> None:
        forkserver.shared().close()
        warn(text)

    return waiting
