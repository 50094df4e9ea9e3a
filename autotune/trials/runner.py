"""Running trials: ``TrialRunner`` starts a configuration's process tree, or hands the
configuration to a warm process that can run it (``process_key``), and returns the
``LiveTrial`` that watches it (``autotune.trials.live``) to its ``TrialResult``
(``autotune.trials.result``). ``TrialRunnerLike`` and ``LiveTrialLike`` say what the search
and verification use of them, which the tests' stand-ins provide too.
"""
from __future__ import annotations

import dataclasses
import getpass
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import weakref
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Protocol

from autotune.config import TrialConfig
from autotune.options import RunOptions
from autotune.probes import MachineLike, as_machine
from autotune.runtime.json_value import JsonObject
from autotune.runtime.knobs import Allocator, CompileMode, Device
from autotune.trials import launch, logs, measure_lock, proctree
from autotune.trials.forkserver import ForkedProcess, ForkServerError, ForkServers
from autotune.trials.live import LiveTrial, TrialProcess
from autotune.trials.proctree import with_package_on_path
from autotune.trials.protocol import Failure, Measurement, Mode, Status
from autotune.trials.result import TrialResult
from autotune.trials.script_report import ScriptReport
from autotune.trials.script_run import ScriptProcess
from autotune.trials.script_session import ScriptRun
from autotune.trials.spec import LossGuard, TrialMode, TrialSpec

# Knobs a process takes when it starts (its environment, its ranks and their cores,
# torch's process-wide settings): configurations that agree on them share a warm
# process, which imports torch and the model file and builds the data set once.
PROCESS_KNOBS = ("nprocs", "threads", "backend", "interop_threads", "allocator", "affinity", "ipex",
                 "device", "cudnn_benchmark", "expandable_segments")
# Idle warm processes kept, least recently used ended first. On GPUs one, and none
# while a process of other knobs measures: an idle one holds its CUDA context.
WARM_PROCESSES = {Device.CPU: 2, Device.CUDA: 1}


def process_key(cfg: TrialConfig) -> str | None:
    """What a process that can measure ``cfg`` warm must have been started with; None
    when ``cfg`` gets a fresh process of its own. A compiled configuration does: in a
    process that compiled before, torch's in-memory caches would make its compilation
    (its one-time cost) look cheaper than the user's run will find it. So does one on
    glibc's allocator on the CPU: how many pages a step faults in there depends on what
    the process allocated and freed before (``minor_faults_per_step`` in a trial's
    result), enough to reverse the order of two batch sizes measured warm; tcmalloc
    faults the same warm as fresh and kept their order (BENCHMARKS.md, "Method")."""
    if cfg.compile != CompileMode.OFF:
        return None
    if cfg.device == Device.CPU and cfg.allocator == Allocator.DEFAULT:
        return None
    return json.dumps({k: getattr(cfg, k) for k in PROCESS_KNOBS}, sort_keys=True)


def compile_cache_env(env: Mapping[str, str], *, folder: Path | None = None) -> dict[str, str]:
    """torch.compile's on-disk cache for a trial or a script run: ``folder`` (the run's own,
    in its output folder: one process that compiled a configuration leaves its kernels for
    the next, verification's and the scripts' alike), else where torch keeps it for the user
    (its default folder under the system temp folder); the user's own choice wins over
    both. Trials and script runs get a temporary folder of their own (TMPDIR), and the
    cache would move into it and be rebuilt from scratch by every run (minutes per run
    for max-autotune)."""
    if "TORCHINDUCTOR_CACHE_DIR" in env:
        return {}
    if folder is not None:
        return {"TORCHINDUCTOR_CACHE_DIR": str(folder.absolute())}
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
                 cwd: Path | None = None, extra: Sequence[str] = (), compile_cache: Path | None = None
                 ) -> ScriptReport:
    """Run an emitted launch.sh for a few steps, from ``cwd`` (default: this process's
    working directory, where the user runs it from); returns its JSON report, written
    with its log into ``workdir`` (``ScriptProcess``). ``compile_cache``: the run's
    torch.compile cache (``compile_cache_env``)."""
    with measure_lock.held():  # before it starts: a run let go at once trains at once
        return start_launcher(launcher, steps=steps, workdir=workdir, timeout_s=timeout_s, cwd=cwd,
                              extra=extra, compile_cache=compile_cache).finish()


def start_launcher(launcher: Path, *, steps: int, workdir: Path, timeout_s: float, cwd: Path | None = None,
                   hold: bool = False, extra: Sequence[str] = (), compile_cache: Path | None = None
                   ) -> ScriptProcess:
    """``run_launcher``'s run, started; with ``hold`` it sets up and waits for ``finish``."""
    env = {**compile_cache_env(os.environ, folder=compile_cache), TRIAL_DIR_VARIABLE: str(workdir.absolute())}
    return ScriptProcess(launcher, steps=steps, workdir=workdir, timeout_s=timeout_s, cwd=cwd or Path.cwd(),
                         env=env, hold=hold, extra=extra)


def _end_all(processes: dict[str, TrialProcess]) -> None:
    for process in processes.values():
        process.kill()
    processes.clear()


class LiveTrialLike(Protocol):
    """A started trial as verification drives it: ``LiveTrial``, or a test's stand-in."""

    result: TrialResult
    def wait_ready(self) -> bool: ...
    def window(self) -> float | None: ...
    def memory(self) -> int: ...
    def kill(self) -> None: ...


class ScriptRunLike(Protocol):
    """A run of a script started ahead of its turn (``ScriptProcess``, or a stand-in)."""

    def finish(self) -> ScriptReport: ...
    def cancel(self) -> None: ...


class TrialRunnerLike(Protocol):
    """What the search and verification call on a trial runner: ``TrialRunner``, or a
    stand-in that measures nothing (the tests' doubles)."""

    workdir: Path
    memory_limit_bytes: int | None
    timeout_s: float  # a trial's limit, unless its run gives another (a long compile)
    def run(self, cfg: TrialConfig, *, name: str, on_window: Callable[[int, float], bool] | None = None,
            trajectory_steps: int | None = None, quality_steps: int | None = None,
            timeout_s: float | None = None, profile: bool = False, seed_offset: int = 0,
            evaluate_at: tuple[int, ...] = (), guard: LossGuard | None = None) -> TrialResult: ...
    def start(self, cfg: TrialConfig, *, name: str, mode: TrialMode | None = None) -> LiveTrialLike: ...
    def run_script(self, launcher: Path, *, steps: int, workdir: Path, timeout_s: float) -> ScriptReport: ...
    def start_script(self, launcher: Path, *, steps: int, workdir: Path, timeout_s: float) -> ScriptRunLike: ...
    def close(self) -> None: ...


class ScriptFactsLike(Protocol):
    """What the runner needs of a script the user runs (``task.way_in.ScriptFacts``)."""

    @property
    def source_module(self) -> str: ...
    @property
    def metric(self) -> str: ...
    @property
    def greater_is_better(self) -> bool: ...
    @property
    def user_values(self) -> JsonObject: ...
    @property
    def stepper(self) -> str: ...
    def overrides(self, cfg: TrialConfig) -> JsonObject: ...
    def trial(self, overrides: JsonObject, *, scored: bool = False) -> tuple[tuple[str, ...], JsonObject]: ...


class TrialRunner:
    """Runs configurations of one model file, each in a fresh process tree."""

    def __init__(
        self,
        *,
        model_file: str | os.PathLike[str],
        machine: MachineLike,
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
        compile_cache: str | os.PathLike[str] | None = None,
        script: ScriptFactsLike | None = None,
        fork: bool = True,
    ) -> None:
        self.model_file = str(Path(model_file).resolve())
        # A Trainer script (model_file is the script): each configuration runs the script
        # with its TrainingArguments overridden, in a fresh process of its own.
        self.script = script
        # torch.compile's cache for the run's processes (None: where torch keeps it)
        self.compile_cache = Path(compile_cache).resolve() if compile_cache is not None else None
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
        # Fresh processes are forked from a warm interpreter of their environment
        # (``forkserver``) unless ``fork`` is False.
        self.forks = ForkServers(folder=self.workdir, python=python) if fork else None
        self._fork_finalizer = weakref.finalize(self, self.forks.close) if self.forks else None
        self.fork_notes: list[str] = []  # said once each: why some processes started fresh

    def _script_run(self, cfg: TrialConfig, seed: int, *, scored: bool) -> ScriptRun | None:
        """A script's run of ``cfg``: its arguments and what its stepper applies, and a seed of
        its own where the trial asks for another than the script's (the quality check's references);
        ``scored``: a quality gate's training."""
        if self.script is None:
            return None
        overrides = dict(self.script.overrides(cfg))
        argv, applied = self.script.trial(overrides, scored=scored)
        applied = dict(applied)
        if seed:
            applied["seed"] = int(str(self.script.user_values.get("seed") or 0)) + seed
        return ScriptRun(argv=argv, overrides=applied, metric=self.script.metric,
                         greater_is_better=self.script.greater_is_better, stepper=self.script.stepper,
                         source_module=self.script.source_module)

    def close(self) -> None:
        """End the idle warm processes."""
        _end_all(self._idle)

    def shutdown(self) -> None:
        """End the idle warm processes and the warm interpreters: the run is over."""
        self.close()
        if self.forks is not None:
            self.forks.close()

    def park(self, process: TrialProcess) -> None:
        """Keep a warm process that finished a configuration for the next one it can run;
        past WARM_PROCESSES idle ones, the least recently used ends."""
        assert process.key is not None
        stale = self._idle.pop(process.key, None)
        if stale is not None:
            stale.kill()
        self._idle[process.key] = process
        keep = WARM_PROCESSES[Device(json.loads(process.key)["device"])]
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
            extra_env: Mapping[str, str] | None = None, timeout_s: float | None = None,
            profile: bool = False, seed_offset: int = 0, evaluate_at: tuple[int, ...] = (),
            guard: LossGuard | None = None) -> TrialResult:
        """Measure ``cfg``; or, with ``trajectory_steps``, record that many losses; or,
        with ``quality_steps``, record that many losses and then score with ``evaluate``;
        or, with ``profile``, warm up and profile one window of about a second
        (``TrialResult.step_profile``: where the step goes; no measurement, ``value`` stays
        None). ``evaluate_at``: a quality run's steps before which evaluate() scores it too
        (``TrialResult.evaluations``); ``seed_offset``: its seed is the runner's plus this (weights
        and data order; the quality check trains fp32 from several); ``guard``: a training's
        or trajectory's losses to stay near, else it ends there. ``on_window(i, samples_per_s)``
        returning True prunes the trial; ``timeout_s``: its
        limit, where not the runner's (``limits.run_limit_s``). A profiled run takes a warm
        process as a measurement does (``process_key``)."""
        if profile and (trajectory_steps is not None or quality_steps is not None):
            raise ValueError("a trial either profiles or trains for its losses, not both")
        mode = TrialMode()
        if trajectory_steps is not None:
            mode = TrialMode.trajectory(trajectory_steps, guard=guard)
        elif quality_steps is not None:
            mode = TrialMode.quality(quality_steps, evaluate_at=evaluate_at, guard=guard)
        elif profile:
            mode = TrialMode.profile()
        live = self.start(cfg, name=name, on_window=on_window, mode=mode, extra_env=extra_env,
                          timeout_s=timeout_s, seed_offset=seed_offset)
        return live.wait()

    def run_script(self, launcher: Path, *, steps: int, workdir: Path,
                   timeout_s: float) -> ScriptReport:
        """Run an emitted launch.sh for ``steps`` steps, alone on the machine."""
        self.close()
        return run_launcher(launcher, steps=steps, workdir=workdir, timeout_s=timeout_s,
                            cwd=self.cwd, compile_cache=self.compile_cache)

    def start_script(self, launcher: Path, *, steps: int, workdir: Path, timeout_s: float) -> ScriptProcess:
        """``run_script``'s run, started now: it sets up and waits until its ``finish``."""
        self.close()
        return start_launcher(launcher, steps=steps, workdir=workdir, timeout_s=timeout_s,
                              cwd=self.cwd, hold=True, compile_cache=self.compile_cache)

    def start(self, cfg: TrialConfig, *, name: str, on_window: Callable[[int, float], bool] | None = None,
              mode: TrialMode | None = None, extra_env: Mapping[str, str] | None = None,
              timeout_s: float | None = None, seed_offset: int = 0) -> LiveTrial:
        """Start ``cfg``'s process tree, or hand ``cfg`` to a warm process that can run it,
        and return the handle that watches it (killed after ``timeout_s``, default the
        runner's)."""
        mode = mode or TrialMode()
        serving = mode.mode is Mode.SERVE
        if serving:
            self.close()  # held side by side, they share the machine with nothing of ours
        key = (process_key(cfg) if self.warm and not serving and not extra_env and self.script is None
               else None)
        folder = self.workdir / name
        folder.mkdir(parents=True, exist_ok=True)
        spec_path = folder / "spec.json"
        for stale in ("events.jsonl", "control", "log.txt"):
            (folder / stale).unlink(missing_ok=True)
        spec = TrialSpec(model_file=self.model_file, config=cfg.to_dict(), events=str(folder / "events.jsonl"),
                         control=str(folder / "control"), log=str(folder / "log.txt"), measure=self.measurement,
                         seed=self.seed + seed_offset, mode=mode, script=self._script_run(cfg, self.seed + seed_offset,
                                                                          scored=mode.mode is Mode.QUALITY))
        result = TrialResult(status=Status.FAILED, log_path=str(folder / "log.txt"))
        try:
            env_vars, result.warnings = launch.environment(cfg, machine=self.machine)
        except ValueError as exc:
            result.failure, result.message = Failure.ERROR, str(exc)
            return LiveTrial.failed_to_start(result)
        result.env = env_vars
        if self.script is not None and mode.mode is Mode.PROFILE:
            # its step runs inside the user's Trainer: nothing of it can be profiled apart
            result.failure = Failure.ERROR
            result.message = "a script's step runs inside its own training and is not profiled"
            return LiveTrial.failed_to_start(result)
        warm = self._warm_process(key) if key is not None else None
        if warm is not None:
            assert warm.control is not None
            dataclasses.replace(spec, next=str(warm.control)).write(spec_path)
            return LiveTrial(self, folder=folder, process=warm, result=result, on_window=on_window,
                             spec=spec_path, timeout_s=timeout_s)
        if cfg.device == Device.CUDA:
            # An idle process keeps its CUDA context (and cuDNN's workspaces) on the GPUs
            # this one will measure on: what it holds would be missing from this one.
            self.close()
        # faulthandler: a trial killed by a signal still says where, in its own log.
        # Temporary files of the trial (multiprocessing's pymp-*, the ranks' file store)
        # go to a folder of its own, removed when it ends: a killed trial cannot clean up,
        # and /tmp filled with them. Short, in the system's temp folder: multiprocessing
        # binds Unix sockets there, whose paths may not exceed 107 bytes.
        tmp = tempfile.mkdtemp(prefix="autotune-trial-")
        control = Path(tmp) / "next" if key is not None else None
        dataclasses.replace(spec, next=str(control) if control is not None else None).write(spec_path)
        env = {**launch.without_distributed(os.environ), **compile_cache_env(os.environ, folder=self.compile_cache),
               **env_vars, **(extra_env or {}),
               "PYTHONUNBUFFERED": "1", "PYTHONFAULTHANDLER": "1", "TMPDIR": tmp,
               TRIAL_DIR_VARIABLE: str(folder)}
        if self.script is not None:
            from autotune.runtime.script_env import offline_env

            env = offline_env(env)
        # The worker runs from autotune's own source tree whether or not it is installed.
        env = with_package_on_path(env)
        argv = launch.command(cfg, ["-m", "autotune.trials.worker", str(spec_path)], python=self.python)
        # O_APPEND: writes land at the end after a cut. Held open for the process's life.
        log = open(folder / "log.txt", "ab")  # noqa: SIM115
        measure_lock.acquire()
        try:
            proc: subprocess.Popen | ForkedProcess | None = self._forked(
                cfg, spec_path, env=env, log=folder / "log.txt", result=result)
            if proc is None:
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
        process = TrialProcess(proc=proc, tmpdir=tmp, key=key, control=control, log=log,
                               marker=(TRIAL_DIR_VARIABLE, str(folder)))
        return LiveTrial(self, folder=folder, process=process, result=result, on_window=on_window,
                         serving=serving, locked=True, warm_on_command=serving and cfg.device == Device.CUDA,
                         timeout_s=timeout_s)

    def _forked(self, cfg: TrialConfig, spec_path: Path, *, env: Mapping[str, str], log: Path,
                result: TrialResult) -> ForkedProcess | None:
        """The trial's worker forked from the warm interpreter of its environment; None where
        it starts fresh: several ranks (their launcher never imports torch, and each rank
        starts as its own command line), or a server that could not start or fork (said
        once, in the trial's warnings)."""
        if self.forks is None or cfg.nprocs > 1:
            return None
        try:
            return self.forks.spawn("autotune.trials.worker", [str(spec_path)], env=env, cwd=self.cwd, log=log,
                                    framework=self.script.source_module if self.script is not None else None)
        except ForkServerError as exc:
            note = f"trial processes of this environment start fresh: {exc}"
            if note not in self.fork_notes:
                self.fork_notes.append(note)
                result.warnings.append(note)
            return None
