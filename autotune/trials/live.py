"""A trial's running process tree, watched: ``TrialProcess`` (the tree, warm or not) and
``LiveTrial`` (one configuration in it: its events, wall time, progress, memory and
limits, and how it ended). ``autotune.trials.runner`` starts them.

The tuner stays idle while a trial measures: it only polls the trial's event file,
its wall time and its memory a few times a second.
"""
from __future__ import annotations

import dataclasses
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Protocol

from autotune.trials import logs, measure_lock, proctree
from autotune.trials.events import (
    BeatEvent,
    DoneEvent,
    ErrorEvent,
    FactsEvent,
    ReadyEvent,
    SetupEvent,
    TrialEvent,
    WarmupEvent,
    WindowEvent,
)
from autotune.trials.forkserver import ForkedProcess
from autotune.trials.protocol import PROGRESS_EVENTS, Command, Failure, Status
from autotune.trials.result import TrialResult

# The tuner stays all but idle while a trial measures: it reads the event file a few
# times a second and the trial's memory (and its log's size) once a second.
POLL_S = 0.1
# A model whose step takes longer than --hang-timeout is slow, not hung: it is hung
# once this many of its own steps pass without one finishing.
HANG_STEPS = 5


@dataclasses.dataclass(eq=False)
class TrialProcess:
    """A trial's process tree; a warm one (``key`` set) takes its next configuration's
    spec from ``control`` once it has reported the last one."""

    proc: subprocess.Popen | ForkedProcess
    tmpdir: str
    key: str | None = None
    control: Path | None = None
    log: IO[bytes] | None = None  # where its output went when it started
    members: dict[int, float] = dataclasses.field(default_factory=dict)
    marker: tuple[str, str] | None = None  # the variable and value every process it starts inherits

    def alive(self) -> bool:
        return self.proc.poll() is None

    def dispatch(self, spec_path: Path) -> None:
        assert self.control is not None
        with open(self.control, "a") as f:
            f.write(f"{spec_path}\n")

    def kill(self) -> None:
        proctree.kill_tree(self.proc.pid)
        self.proc.wait()
        # Descendants of a root that already exited were re-parented: find them by record,
        # and by the marker in their environment (those started after the last record).
        proctree.kill_known(self.members)
        if self.marker is not None:
            proctree.kill_marked(*self.marker)
        if self.log is not None:
            self.log.close()
            self.log = None
        shutil.rmtree(self.tmpdir, ignore_errors=True)


class TrialOwner(Protocol):
    """What a trial reads of the runner that started it (``runner.TrialRunner``): its
    limits, and where a warm process goes back once its configuration is done."""

    timeout_s: float
    hang_s: float
    setup_hang_s: float | None
    memory_limit_bytes: int | None
    log_cap_bytes: int
    def park(self, process: TrialProcess) -> None: ...


class LiveTrial:
    """A running trial, watched: its events, wall time, progress and memory. ``wait()``
    follows it to the end; a serving trial (verification) instead runs one window per
    ``window()`` call, idle in between. A warm process (``TrialProcess.key``) outlives
    the trial that finishes well: it goes back to the runner for the next one."""

    def __init__(self, runner: TrialOwner | None, *, folder: Path | None, process: TrialProcess | None,
                 result: TrialResult, on_window: Callable[[int, float], bool] | None = None,
                 serving: bool = False, locked: bool = False, spec: Path | None = None,
                 warm_on_command: bool = False, timeout_s: float | None = None) -> None:
        self.runner, self.folder, self.result, self.process = runner, folder, result, process
        # this trial's limit: the runner's, or one of its own (a compile measured to be long)
        self.timeout_s = timeout_s if timeout_s is not None else runner.timeout_s if runner else 0.0
        self.on_window, self.serving, self.warm_on_command = on_window, serving, warm_on_command
        self.killed_for: tuple[Status | Failure, str] | None = None  # PRUNED, or the failure
        self.ready = False
        self.pending_since: float | None = None  # a requested window not yet reported
        self.last_progress: float | None = None  # set once steps run: only then is a stall a hang
        self.step_s = 0.0  # the trial's own step time, once seen: the hang limit scales with it
        self.finished = runner is None
        self.memory_checked = 0.0
        self.setup_seen_at = 0.0
        self.warm_sent_at: float | None = None
        if runner is None:
            return
        assert folder is not None and process is not None
        if not locked:  # a fresh process's trial took its turn before it started
            measure_lock.acquire()
        self.started = time.monotonic()
        self.started_epoch = time.time()  # events carry wall-clock stamps
        if isinstance(process.proc, ForkedProcess):  # a warm one too, forked for an earlier trial
            result.preimported_s = process.proc.server.ready_s
        self.log_cut = 0  # bytes cut from the log (cap_log)
        self.reader = logs.EventReader(folder / "events.jsonl")
        self.memory_watch = proctree.TreeMemory(process.proc.pid, limit=runner.memory_limit_bytes)
        if spec is not None:
            process.dispatch(spec)

    @property
    def proc(self) -> subprocess.Popen | ForkedProcess | None:
        return self.process.proc if self.process is not None else None

    @classmethod
    def failed_to_start(cls, result: TrialResult) -> LiveTrial:
        return cls(None, folder=None, process=None, result=result)

    # --- watching -------------------------------------------------------------------

    def _handle(self, ev: TrialEvent, *, ended: bool = False) -> None:
        """Record ``ev``; a window read once the trial ``ended`` is not offered for pruning."""
        result = self.result
        if ev.KIND in PROGRESS_EVENTS:
            self.last_progress = time.monotonic()
        if isinstance(ev, SetupEvent):
            result.setup = ev
            self.setup_seen_at = time.monotonic()
        elif isinstance(ev, BeatEvent):
            if ev.step == 1 and result.setup is not None and result.setup.t:  # the first step's time
                self.step_s = max(0.0, ev.t - result.setup.t)
        elif isinstance(ev, FactsEvent):
            result.facts = ev.to_json()
        elif isinstance(ev, WarmupEvent):
            result.warmup = ev
            self.step_s = ev.step_s  # a steady step
        elif isinstance(ev, ReadyEvent):
            self.ready = True
        elif isinstance(ev, WindowEvent):
            self.pending_since = None
            result.window_seconds.append(ev.seconds)
            result.values.append(ev.samples_per_s)
            if self.killed_for is None and not ended and self.on_window and self.on_window(ev.i, ev.samples_per_s):
                self.killed_for = (Status.PRUNED, "")
        elif isinstance(ev, DoneEvent):
            result.done = ev
        elif isinstance(ev, ErrorEvent) and result.failure is None:
            result.failure, result.message = ev.kind, ev.message

    def poll(self) -> bool:
        """Read new events and enforce the limits; True once the trial has ended."""
        if self.finished:
            return True
        assert self.runner is not None and self.process is not None
        for ev in self.reader.read():
            self._handle(ev)
        if self._reported():
            self._finish()
            return True
        if self.killed_for is None and self.process.alive():
            now = time.monotonic()
            runner = self.runner
            idle = self.serving and self.ready and self.pending_since is None
            if not (self.serving and self.ready) and self._busy_s(now) > self.timeout_s:
                self.killed_for = (Failure.TIMEOUT, f"still running after {self.timeout_s:.0f} s")
            elif not idle and self.last_progress is not None and now - self.last_progress > self.hang_limit:
                self.killed_for = (Failure.HANG, f"no progress for {self.hang_limit:.0f} s while steps ran "
                                         f"(a step took {self.step_s:.1f} s)")
            elif (self.result.setup is None and runner.setup_hang_s is not None
                  and now - self.started > runner.setup_hang_s):
                self.killed_for = (Failure.HANG, f"not set up after {runner.setup_hang_s:.0f} s: stuck in "
                                         "setup (importing the model file, build_dataset, "
                                         "build_model or the DataLoader's first batch)")
            elif now - self.memory_checked >= self.memory_watch.check_s:
                # Walking the process table costs CPU; a trial measuring meanwhile pays
                # for it once a second, more often only while it grows towards its limit.
                self.memory_checked = now
                self._cap_log()
                self.process.members.update(proctree.snapshot(self.process.proc.pid))
                held = self.memory_watch.read()
                self.result.peak_tree_mb = self.memory_watch.peak / 2**20
                if runner.memory_limit_bytes and held is not None and held > runner.memory_limit_bytes:
                    self.killed_for = (
                        Failure.OUT_OF_MEMORY,
                        f"used {held / 2**20:.0f} MiB, over the trial limit of "
                        f"{runner.memory_limit_bytes / 2**20:.0f} MiB",
                    )
        if self.killed_for is not None or not self.process.alive():
            self._finish()
            return True
        return False

    def _busy_s(self, now: float) -> float:
        """Seconds since the start, less those spent set up and waiting for its turn to warm
        up (``wait_ready``): verification sets up several processes at once on a GPU, and
        the last one's turn may come after others' compiles."""
        if not self.warm_on_command or self.result.setup is None:
            return now - self.started
        waited_until = self.warm_sent_at if self.warm_sent_at is not None else now
        return now - self.started - max(0.0, waited_until - self.setup_seen_at)

    def _reported(self) -> bool:
        """A warm process's trial ends with its report: its process lives on."""
        assert self.process is not None
        return self.process.key is not None and self.result.done is not None

    @property
    def hang_limit(self) -> float:
        """Seconds without a finished step (or window) that make a hang: --hang-timeout,
        or five of the trial's own steps where a step is that slow."""
        assert self.runner is not None
        return max(self.runner.hang_s, HANG_STEPS * self.step_s)

    def _cap_log(self) -> None:
        assert self.runner is not None
        cap = self.runner.log_cap_bytes
        self.log_cut += logs.cap_log(Path(self.result.log_path), cap=cap,
                                keep=min(logs.LOG_KEEP_BYTES, cap // 4))

    def _wait_until(self, condition: Callable[[], bool]) -> bool:
        while not self.poll():
            if condition():
                return True
            time.sleep(POLL_S)
        return condition()

    def wait(self) -> TrialResult:
        """Follow the trial to its end (killing it on any limit) and classify it."""
        try:
            self._wait_until(lambda: False)
        finally:
            self.kill()
        return self.result

    def wait_ready(self) -> bool:
        """For a serving trial: set up and warmed up, waiting for window commands. On a GPU
        its warm-up starts now, once it is set up (``worker.serve``): called for one
        process at a time, the others' first steps never overlap it."""
        try:
            if self.warm_on_command and not self.ready:
                if not self._wait_until(lambda: self.result.setup is not None):
                    return False
                self._command(Command.WARM)
                self.warm_sent_at = time.monotonic()
            return self._wait_until(lambda: self.ready)
        except BaseException:
            self.kill()
            raise

    def _command(self, command: Command) -> None:
        assert self.folder is not None
        with open(self.folder / "control", "a") as f:
            f.write(f"{command}\n")

    def window(self) -> float | None:
        """Run one measurement window now; its throughput, or None if the trial died."""
        assert self.folder is not None
        count = len(self.result.values)
        self.pending_since = self.last_progress = time.monotonic()
        self._command(Command.WINDOW)
        try:
            ok = self._wait_until(lambda: len(self.result.values) > count)
        except BaseException:
            self.kill()
            raise
        return self.result.values[count] if ok else None

    def memory(self) -> int:
        """What the trial's whole process tree holds now, each page once, in bytes."""
        if self.process is None or self.finished:
            return 0
        return proctree.tree_memory(self.process.proc.pid)

    def kill(self) -> None:
        """End the trial now, with its process (a finished one's process is no longer its own)."""
        if not self.finished:
            assert self.process is not None
            self.process.kill()
            self._finish()

    def _phases(self) -> dict[str, float]:
        """Where a trial's wall time went; everything but ``measure_s`` is per-trial
        overhead (the lever on tuning time, see BENCHMARKS.md)."""
        result, phases = self.result, {}
        setup = result.setup
        if setup is not None:
            # Launch (of the ranks too) and imports, up to the start of the model file's setup.
            phases["start_import_s"] = setup.t - setup.seconds - self.started_epoch
            phases["setup_s"] = setup.seconds
            if result.warmup is not None:
                phases["warmup_s"] = result.warmup.t - setup.t
        phases["measure_s"] = sum(result.window_seconds)
        phases["overhead_s"] = result.wall_s - phases["measure_s"]
        return {k: round(max(0.0, v), 3) for k, v in phases.items()}

    # --- the end --------------------------------------------------------------------

    def _finish(self) -> None:
        if self.finished:
            return
        assert self.process is not None and self.runner is not None
        process = self.process
        # lines written just before the end: a configuration that failed at once ended its
        # process right after its setup line, and a cold process ends right after its last
        # window and report, which the last poll may not have read
        for ev in self.reader.read():
            self._handle(ev, ended=True)
        kept = (process.key is not None and self.killed_for is None and self.result.done is not None
                and self.result.failure is None and process.alive())
        if kept:
            self.runner.park(process)
        else:
            process.kill()
        self._cap_log()
        if self.log_cut:
            self.result.warnings.append(
                f"its log grew past {self.runner.log_cap_bytes:,} bytes: {self.log_cut:,} bytes "
                f"from the middle were cut ({self.result.log_path})")
        self.finished = True
        measure_lock.release()
        result = self.result
        result.wall_s = time.monotonic() - self.started
        result.log_tail = logs.tail(Path(result.log_path))
        result.phases = self._phases()
        if self.killed_for is not None:
            result.status = Status.PRUNED if self.killed_for[0] == Status.PRUNED else Status.FAILED
            # A rank that reported its error (a CUDA OOM) can leave its peers waiting in a
            # collective: the kill for the hang or timeout that follows is a consequence,
            # and the error its cause.
            reported = result.failure is not None and self.killed_for[0] in (Failure.HANG, Failure.TIMEOUT)
            if result.status == Status.FAILED and not reported:
                kind, result.message = self.killed_for
                result.failure = Failure(kind)
        elif result.done is not None:
            result.status = Status.OK
            code = process.proc.returncode
            if code not in (None, 0):
                result.warnings.append(
                    f"the trial finished its measurement, then exited with code "
                    f"{code}: {logs.signal_from_log(result.log_tail) or 'see its log'}")
            if result.done.value is not None:  # a measurement's
                result.value = result.done.value
                result.iqr = result.done.iqr
                result.values = list(result.done.values)
        elif result.failure is None:
            result.failure = Failure.CRASH
            code = process.proc.returncode
            sig = -code if code is not None and code < 0 else None
            name_ = signal.Signals(sig).name if sig else logs.signal_from_log(result.log_tail)
            result.message = f"killed by {name_}" if name_ else f"exit code {code}"
