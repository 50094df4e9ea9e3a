"""Running one trial in its own process tree, and telling how it ended: ``TrialRunner``
starts it, ``LiveTrial`` watches it. ``TrialRunnerLike`` and ``LiveTrialLike`` say what
the search and verification use of them, which the tests' stand-ins provide too.

The tuner stays idle while a trial measures: it only polls the trial's event file,
its wall time and its memory a few times a second.
"""
from __future__ import annotations

import dataclasses
import getpass
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import weakref
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any, Protocol

from autotune.config import TrialConfig
from autotune.emit import launch
from autotune.options import RunOptions
from autotune.probes import Machine, as_machine
from autotune.runtime.knobs import CompileMode
from autotune.task import with_package_on_path
from autotune.trials import logs, measure_lock, proctree
from autotune.trials.protocol import PROGRESS_EVENTS, Event, Failure, Measurement, Mode, Status

# The tuner stays all but idle while a trial measures: it reads the event file a few
# times a second and the trial's memory (and its log's size) once a second.
POLL_S = 0.1
MEMORY_CHECK_S = 1.0
# A model whose step takes longer than --hang-timeout is slow, not hung: it is hung
# once this many of its own steps pass without one finishing.
HANG_STEPS = 5

# Knobs a process takes when it starts (its environment, its ranks and their cores,
# torch's process-wide settings): configurations that agree on them share a warm
# process, which imports torch and the model file and builds the data set once.
PROCESS_KNOBS = ("nprocs", "threads", "backend", "interop_threads", "allocator", "affinity", "ipex",
                 "device", "cudnn_benchmark")
# Idle warm processes kept, least recently used ended first. On GPUs one: an idle
# process holds its CUDA context on the device while another one measures.
WARM_PROCESSES = {"cpu": 2, "cuda": 1}


def process_key(cfg: TrialConfig) -> str | None:
    """What a process that can measure ``cfg`` warm must have been started with; None
    when ``cfg`` gets a fresh process of its own. A compiled configuration does: in a
    process that compiled before, torch's in-memory caches would make its compilation
    (its one-time cost) look cheaper than the user's run will find it."""
    if cfg.compile != CompileMode.OFF:
        return None
    return json.dumps({k: getattr(cfg, k) for k in PROCESS_KNOBS}, sort_keys=True)


@dataclasses.dataclass
class TrialResult:
    status: Status
    value: float | None = None  # median window throughput, samples/s
    values: list[float] = dataclasses.field(default_factory=list)
    iqr: float | None = None
    failure: Failure | None = None
    message: str = ""
    log_tail: str = ""
    setup: dict[str, Any] = dataclasses.field(default_factory=dict)
    facts: dict[str, Any] = dataclasses.field(default_factory=dict)
    warmup: dict[str, Any] = dataclasses.field(default_factory=dict)
    done: dict[str, Any] = dataclasses.field(default_factory=dict)
    peak_tree_rss_mb: float = 0.0
    wall_s: float = 0.0
    window_seconds: list[float] = dataclasses.field(default_factory=list)
    phases: dict[str, float] = dataclasses.field(default_factory=dict)
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    warnings: list[str] = dataclasses.field(default_factory=list)
    log_path: str = ""

    @property
    def one_time_s(self) -> float | None:
        """What this configuration costs once, before its steady steps: its own setup (the
        DataLoader, its first batch, the model) plus the first step's excess over a steady
        step (where compile lands). Not the process's setup (imports, the model file's
        build_dataset): every configuration pays that alike, and a warm process paid it
        before."""
        if not self.setup or not self.warmup:
            return None
        excess = self.warmup["first_step_s"] - self.warmup["step_s"]
        own = self.setup["seconds"] - float(self.setup.get("process_s") or 0.0)
        return max(0.0, own) + max(0.0, excess)

    @property
    def losses(self) -> list[float]:
        return list(self.done.get("losses", []))

    def describe_failure(self) -> str:
        text = Failure.describe(self.failure)
        return f"{text}: {self.message}" if self.message else text

    def summary(self) -> dict[str, Any]:
        """What is stored on the study's trial: small, JSON-able."""
        return {
            "status": self.status,
            "value": self.value,
            "values": self.values,
            "iqr": self.iqr,
            "failure": self.failure,
            "message": self.message[:1000],
            "log_tail": self.log_tail[-3000:],
            "one_time_s": self.one_time_s,
            "peak_rss_mb": round(self.peak_tree_rss_mb, 1),
            "wall_s": round(self.wall_s, 2),
            "phases": self.phases,
            "warm": bool(self.setup.get("warm")),  # run in a process an earlier trial started
            "losses": self.losses[:200],
            "facts": {k: v for k, v in self.facts.items() if k != "layer_widths"},
            "threads_seen": self.setup.get("threads"),
            "world": self.setup.get("world"),
            # On CUDA: rank 0's GPU memory at its peak and the GPU's size, which bound the
            # batch sizes worth trying.
            **{k: self.done[k] for k in ("cuda_peak_mb", "cuda_total_mb")
               if self.done.get(k) is not None},
        }


def compile_cache_env(env: Mapping[str, str]) -> dict[str, str]:
    """torch.compile's cache where torch keeps it for the user (its default folder under
    the system temp folder), unless they chose one: trials and script runs get a
    temporary folder of their own (TMPDIR), and the cache would move into it and be
    rebuilt from scratch by every run (minutes per run for max-autotune)."""
    if "TORCHINDUCTOR_CACHE_DIR" in env:
        return {}
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    user = re.sub(r"[\\/:*?\"<>|]", "_", user)  # as torch sanitizes it
    return {"TORCHINDUCTOR_CACHE_DIR": os.path.join(tempfile.gettempdir(), f"torchinductor_{user}")}


# Set in every trial's environment (so in all its descendants): tests and tools find a
# trial's processes by it, whatever their command line or working directory.
TRIAL_DIR_VARIABLE = "AUTOTUNE_TRIAL_DIR"


def run_launcher(launcher: Path, *, steps: int, workdir: Path, timeout_s: float,
                 cwd: Path | None = None) -> dict[str, Any]:
    """Run an emitted launch.sh for a few steps, from ``cwd`` (default: this process's
    working directory, where the user runs it from); returns its JSON report, written
    with its log into ``workdir``. Without evaluate(): the runs compared are timed, and
    two configurations cross different numbers of epoch ends in the same time."""
    workdir = workdir.absolute()
    workdir.mkdir(parents=True, exist_ok=True)
    report = workdir / "script-report.json"
    report.unlink(missing_ok=True)
    log = workdir / "script-log.txt"
    tmp = tempfile.mkdtemp(prefix="autotune-script-")  # as a trial's (TrialRunner.start)
    argv = ["bash", str(launcher.absolute()), "--max-steps", str(steps), "--no-checkpoint",
            "--no-evaluate", "--log-every", str(max(1, steps)), "--report", str(report)]
    with open(log, "wb") as out, measure_lock.held():
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                cwd=str(cwd or Path.cwd()), stdin=subprocess.DEVNULL,
                                start_new_session=True,
                                env={**launch.without_distributed(os.environ),
                                     **compile_cache_env(os.environ), "TMPDIR": tmp,
                                     TRIAL_DIR_VARIABLE: str(workdir)})
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pass
        finally:
            proctree.kill_tree(proc.pid)
            proc.wait()
            shutil.rmtree(tmp, ignore_errors=True)
    if proc.returncode != 0 or not report.exists():
        tail = logs.tail(log, 15)
        raise RuntimeError(f"{launcher.name} failed (exit code {proc.returncode}):\n{tail}")
    return json.loads(report.read_text())


@dataclasses.dataclass(eq=False)
class TrialProcess:
    """A trial's process tree; a warm one (``key`` set) takes its next configuration's
    spec from ``control`` once it has reported the last one."""

    proc: subprocess.Popen
    tmpdir: str
    key: str | None = None
    control: Path | None = None
    log: IO[bytes] | None = None  # where its output went when it started
    members: dict[int, float] = dataclasses.field(default_factory=dict)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def dispatch(self, spec_path: Path) -> None:
        assert self.control is not None
        with open(self.control, "a") as f:
            f.write(f"{spec_path}\n")

    def kill(self) -> None:
        proctree.kill_tree(self.proc.pid)
        self.proc.wait()
        # Descendants of a root that already exited were re-parented: find them by record.
        proctree.kill_known(self.members)
        if self.log is not None:
            self.log.close()
            self.log = None
        shutil.rmtree(self.tmpdir, ignore_errors=True)


def _end_all(processes: dict[str, TrialProcess]) -> None:
    for process in processes.values():
        process.kill()
    processes.clear()


class LiveTrialLike(Protocol):
    """A started trial as verification drives it: ``LiveTrial``, or a test's stand-in."""

    result: TrialResult
    def wait_ready(self) -> bool: ...
    def window(self) -> float | None: ...
    def rss(self) -> int: ...
    def kill(self) -> None: ...


class TrialRunnerLike(Protocol):
    """What the search and verification call on a trial runner: ``TrialRunner``, or a
    stand-in that measures nothing (the tests' doubles)."""

    workdir: Path
    memory_limit_bytes: int | None
    def run(self, cfg: TrialConfig, *, name: str, on_window: Callable[[int, float], bool] | None = None,
            trajectory_steps: int | None = None, quality_steps: int | None = None) -> TrialResult: ...
    def start(self, cfg: TrialConfig, *, name: str, mode: Mapping[str, Any] | None = None) -> LiveTrialLike: ...
    def run_script(self, launcher: Path, *, steps: int, workdir: Path, timeout_s: float) -> dict[str, Any]: ...


class TrialRunner:
    """Runs configurations of one model file, each in a fresh process tree."""

    def __init__(
        self,
        *,
        model_file: str | os.PathLike[str],
        machine: Machine | Mapping[str, Any],
        workdir: str | os.PathLike[str],
        measurement: Measurement = Measurement(),
        timeout_s: float = RunOptions.trial_timeout_s,
        hang_s: float = RunOptions.hang_timeout_s,
        setup_hang_s: float | None = None,
        memory_limit_bytes: int | None = None,
        log_cap_bytes: int = logs.LOG_CAP_BYTES,
        cwd: str | os.PathLike[str] | None = None,
        python: str = sys.executable,
        seed: int = 0,
        warm: bool = True,
    ) -> None:
        self.model_file = str(Path(model_file).resolve())
        self.machine = as_machine(machine)
        self.workdir = Path(workdir).resolve()  # each trial's files: a folder of its own
        # Trials run where the user runs autotune (where the model file's check ran), so a
        # relative path in the model file means the same in every trial.
        self.cwd = Path(cwd).resolve() if cwd is not None else Path.cwd()
        self.measurement = measurement
        self.timeout_s = timeout_s
        self.hang_s = hang_s
        # Setup (imports, build_dataset, build_model, the DataLoader's first batch) has no
        # heartbeat: past this a trial that has not finished it is hung in it.
        self.setup_hang_s = setup_hang_s
        self.memory_limit_bytes = memory_limit_bytes
        self.log_cap_bytes = log_cap_bytes
        self.python = python
        self.seed = seed
        # Configurations that share their process knobs are measured one after another
        # in one warm process (``process_key``); False: each in a fresh one.
        self.warm = warm
        self._idle: dict[str, TrialProcess] = {}
        self._finalizer = weakref.finalize(self, _end_all, self._idle)

    def close(self) -> None:
        """End the idle warm processes."""
        _end_all(self._idle)

    def park(self, process: TrialProcess) -> None:
        """Keep a warm process that finished a configuration for the next one it can run;
        past WARM_PROCESSES idle ones, the least recently used ends."""
        assert process.key is not None
        stale = self._idle.pop(process.key, None)
        if stale is not None:
            stale.kill()
        self._idle[process.key] = process
        keep = WARM_PROCESSES["cuda" if '"device": "cuda"' in process.key else "cpu"]
        while len(self._idle) > keep:
            oldest = next(iter(self._idle))
            self._idle.pop(oldest).kill()

    def _warm_process(self, key: str) -> TrialProcess | None:
        process = self._idle.pop(key, None)
        if process is not None and not process.alive():
            process.kill()
            return None
        return process

    def run(self, cfg: TrialConfig, *, name: str, on_window: Callable[[int, float], bool] | None = None,
            trajectory_steps: int | None = None, quality_steps: int | None = None,
            extra_env: Mapping[str, str] | None = None) -> TrialResult:
        """Measure ``cfg``; or, with ``trajectory_steps``, record that many losses; or,
        with ``quality_steps``, train that many steps and score with ``evaluate``.
        ``on_window(i, samples_per_s)`` returning True prunes the trial."""
        mode: dict[str, Any] = {}
        if trajectory_steps is not None:
            mode = {"mode": Mode.TRAJECTORY, "steps": trajectory_steps}
        elif quality_steps is not None:
            mode = {"mode": Mode.QUALITY, "steps": quality_steps}
        live = self.start(cfg, name=name, on_window=on_window, mode=mode, extra_env=extra_env)
        return live.wait()

    def run_script(self, launcher: Path, *, steps: int, workdir: Path,
                   timeout_s: float) -> dict[str, Any]:
        """Run an emitted launch.sh for ``steps`` steps, alone on the machine."""
        self.close()
        return run_launcher(launcher, steps=steps, workdir=workdir, timeout_s=timeout_s,
                            cwd=self.cwd)

    def start(self, cfg: TrialConfig, *, name: str, on_window: Callable[[int, float], bool] | None = None,
              mode: Mapping[str, Any] | None = None, extra_env: Mapping[str, str] | None = None) -> LiveTrial:
        """Start ``cfg``'s process tree, or hand ``cfg`` to a warm process that can run it,
        and return the handle that watches it."""
        mode = dict(mode or {})
        serving = mode.get("mode") == Mode.SERVE
        if serving:
            self.close()  # held side by side, they share the machine with nothing of ours
        key = process_key(cfg) if self.warm and not serving and not extra_env else None
        folder = self.workdir / name
        folder.mkdir(parents=True, exist_ok=True)
        spec_path = folder / "spec.json"
        for stale in ("events.jsonl", "control", "log.txt"):
            (folder / stale).unlink(missing_ok=True)
        spec = {
            "model_file": self.model_file,
            "config": cfg.to_dict(),
            "events": str(folder / "events.jsonl"),
            "control": str(folder / "control"),
            "log": str(folder / "log.txt"),
            "measure": self.measurement.to_dict(),
            "seed": self.seed,
            **mode,
        }
        result = TrialResult(status=Status.FAILED, log_path=str(folder / "log.txt"))
        try:
            env_vars, result.warnings = launch.environment(cfg, machine=self.machine)
        except ValueError as exc:
            result.failure, result.message = Failure.ERROR, str(exc)
            return LiveTrial.failed_to_start(result)
        result.env = env_vars
        warm = self._warm_process(key) if key is not None else None
        if warm is not None:
            assert warm.control is not None
            spec_path.write_text(json.dumps({**spec, "next": str(warm.control)}, indent=1))
            return LiveTrial(self, folder=folder, process=warm, result=result, on_window=on_window,
                             spec=spec_path)
        # faulthandler: a trial killed by a signal still says where, in its own log.
        # Temporary files of the trial (multiprocessing's pymp-*, the ranks' file store)
        # go to a folder of its own, removed when it ends: a killed trial cannot clean up,
        # and /tmp filled with them. Short, in the system's temp folder: multiprocessing
        # binds Unix sockets there, whose paths may not exceed 107 bytes.
        tmp = tempfile.mkdtemp(prefix="autotune-trial-")
        control = Path(tmp) / "next" if key is not None else None
        if control is not None:
            spec["next"] = str(control)
        spec_path.write_text(json.dumps(spec, indent=1))
        env = {**launch.without_distributed(os.environ), **compile_cache_env(os.environ),
               **env_vars, **(extra_env or {}),
               "PYTHONUNBUFFERED": "1", "PYTHONFAULTHANDLER": "1", "TMPDIR": tmp,
               TRIAL_DIR_VARIABLE: str(folder)}
        # The worker runs from autotune's own source tree whether or not it is installed.
        env = with_package_on_path(env)
        argv = launch.command(cfg, ["-m", "autotune.trials.worker", str(spec_path)], python=self.python)
        # O_APPEND: writes land at the end after a cut. Held open for the process's life.
        log = open(folder / "log.txt", "ab")  # noqa: SIM115
        measure_lock.acquire()
        try:
            proc = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=env, cwd=str(self.cwd), start_new_session=True,
                preexec_fn=proctree.die_with_parent,
            )
        except BaseException:
            measure_lock.release()
            log.close()
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        process = TrialProcess(proc=proc, tmpdir=tmp, key=key, control=control, log=log)
        return LiveTrial(self, folder=folder, process=process, result=result, on_window=on_window,
                         serving=serving, locked=True)


class LiveTrial:
    """A running trial, watched: its events, wall time, progress and memory. ``wait()``
    follows it to the end; a serving trial (verification) instead runs one window per
    ``window()`` call, idle in between. A warm process (``TrialProcess.key``) outlives
    the trial that finishes well: it goes back to the runner for the next one."""

    def __init__(self, runner: TrialRunner | None, *, folder: Path | None, process: TrialProcess | None,
                 result: TrialResult, on_window: Callable[[int, float], bool] | None = None,
                 serving: bool = False, locked: bool = False, spec: Path | None = None) -> None:
        self.runner, self.folder, self.result, self.process = runner, folder, result, process
        self.on_window, self.serving = on_window, serving
        self.killed_for: tuple[Status | Failure, str] | None = None  # PRUNED, or the failure
        self.ready = False
        self.pending_since: float | None = None  # a requested window not yet reported
        self.last_progress: float | None = None  # set once steps run: only then is a stall a hang
        self.step_s = 0.0  # the trial's own step time, once seen: the hang limit scales with it
        self.finished = runner is None
        self.memory_checked = 0.0
        if runner is None:
            return
        assert folder is not None and process is not None
        if not locked:  # a fresh process's trial took its turn before it started
            measure_lock.acquire()
        self.started = time.monotonic()
        self.started_epoch = time.time()  # events carry wall-clock stamps
        self.log_cut = 0  # bytes cut from the log (cap_log)
        self.reader = logs.EventReader(folder / "events.jsonl")
        if spec is not None:
            process.dispatch(spec)

    @property
    def proc(self) -> subprocess.Popen | None:
        return self.process.proc if self.process is not None else None

    @classmethod
    def failed_to_start(cls, result: TrialResult) -> LiveTrial:
        return cls(None, folder=None, process=None, result=result)

    # --- watching -------------------------------------------------------------------

    def _handle(self, ev: dict[str, Any]) -> None:
        try:
            kind = Event(ev.get("e"))
        except ValueError:
            return  # a line from a newer worker: nothing here acts on it
        result = self.result
        if kind in PROGRESS_EVENTS:
            self.last_progress = time.monotonic()
        if kind is Event.SETUP:
            result.setup = ev
        elif kind is Event.BEAT:
            if ev.get("step") == 1 and result.setup.get("t"):  # the first step's time
                self.step_s = max(0.0, float(ev["t"]) - float(result.setup["t"]))
        elif kind is Event.FACTS:
            result.facts = ev
        elif kind is Event.WARMUP:
            result.warmup = ev
            self.step_s = float(ev.get("step_s") or 0.0)  # a steady step
        elif kind is Event.READY:
            self.ready = True
        elif kind is Event.WINDOW:
            self.pending_since = None
            result.window_seconds.append(float(ev.get("seconds", 0.0)))
            result.values.append(float(ev["samples_per_s"]))
            if self.killed_for is None and self.on_window and self.on_window(ev["i"], ev["samples_per_s"]):
                self.killed_for = (Status.PRUNED, "")
        elif kind is Event.DONE:
            result.done = ev
        elif kind is Event.ERROR and result.failure is None:
            result.failure, result.message = Failure(ev["kind"]), ev["message"]

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
            if not (self.serving and self.ready) and now - self.started > runner.timeout_s:
                self.killed_for = (Failure.TIMEOUT, f"still running after {runner.timeout_s:.0f} s")
            elif not idle and self.last_progress is not None and now - self.last_progress > self.hang_limit:
                self.killed_for = (Failure.HANG, f"no progress for {self.hang_limit:.0f} s while steps ran "
                                         f"(a step took {self.step_s:.1f} s)")
            elif (not self.result.setup and runner.setup_hang_s is not None
                  and now - self.started > runner.setup_hang_s):
                self.killed_for = (Failure.HANG, f"not set up after {runner.setup_hang_s:.0f} s: stuck in "
                                         "setup (importing the model file, build_dataset, "
                                         "build_model or the DataLoader's first batch)")
            elif now - self.memory_checked >= MEMORY_CHECK_S:
                # Walking the process table costs CPU; a trial measuring meanwhile must
                # not pay for it more than once a second.
                self.memory_checked = now
                self._cap_log()
                self.process.members.update(proctree.snapshot(self.process.proc.pid))
                rss = proctree.tree_rss(self.process.proc.pid)
                self.result.peak_tree_rss_mb = max(self.result.peak_tree_rss_mb, rss / 2**20)
                if runner.memory_limit_bytes and rss > runner.memory_limit_bytes:
                    self.killed_for = (
                        Failure.OUT_OF_MEMORY,
                        f"used {rss / 2**20:.0f} MiB, over the trial limit of "
                        f"{runner.memory_limit_bytes / 2**20:.0f} MiB",
                    )
        if self.killed_for is not None or not self.process.alive():
            self._finish()
            return True
        return False

    def _reported(self) -> bool:
        """A warm process's trial ends with its report: its process lives on."""
        assert self.process is not None
        return self.process.key is not None and bool(self.result.done)

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
        """For a serving trial: set up and warmed up, waiting for window commands."""
        try:
            return self._wait_until(lambda: self.ready)
        except BaseException:
            self.kill()
            raise

    def window(self) -> float | None:
        """Run one measurement window now; its throughput, or None if the trial died."""
        assert self.folder is not None
        count = len(self.result.values)
        self.pending_since = self.last_progress = time.monotonic()
        with open(self.folder / "control", "a") as f:
            f.write("window\n")
        try:
            ok = self._wait_until(lambda: len(self.result.values) > count)
        except BaseException:
            self.kill()
            raise
        return self.result.values[count] if ok else None

    def rss(self) -> int:
        """Resident memory of the trial's whole process tree now, in bytes."""
        if self.process is None or self.finished:
            return 0
        return proctree.tree_rss(self.process.proc.pid)

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
        if setup:
            # Launch (of the ranks too) and imports, up to the start of the model file's setup.
            phases["start_import_s"] = setup["t"] - setup["seconds"] - self.started_epoch
            phases["setup_s"] = setup["seconds"]
            if result.warmup:
                phases["warmup_s"] = result.warmup["t"] - setup["t"]
        phases["measure_s"] = sum(result.window_seconds)
        phases["overhead_s"] = result.wall_s - phases["measure_s"]
        return {k: round(max(0.0, v), 3) for k, v in phases.items()}

    # --- the end --------------------------------------------------------------------

    def _finish(self) -> None:
        if self.finished:
            return
        assert self.process is not None and self.runner is not None
        process = self.process
        for ev in self.reader.read():  # lines written just before the end
            if ev.get("e") in (Event.DONE, Event.ERROR):
                self._handle(ev)
        kept = (process.key is not None and self.killed_for is None and bool(self.result.done)
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
        elif result.done:
            result.status = Status.OK
            code = process.proc.returncode
            if code not in (None, 0):
                result.warnings.append(
                    f"the trial finished its measurement, then exited with code "
                    f"{code}: {logs.signal_from_log(result.log_tail) or 'see its log'}")
            if "value" in result.done:
                result.value = float(result.done["value"])
                result.iqr = result.done.get("iqr")
                result.values = list(result.done.get("values", result.values))
        elif result.failure is None:
            result.failure = Failure.CRASH
            code = process.proc.returncode
            sig = -code if code < 0 else None
            name_ = signal.Signals(sig).name if sig else logs.signal_from_log(result.log_tail)
            result.message = f"killed by {name_}" if name_ else f"exit code {code}"
