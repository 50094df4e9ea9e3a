"""What runs inside a trial process: apply the knobs, train, measure, report.

Started by ``autotune.trials.runner`` as ``python -m autotune.trials.worker SPEC`` (one process) or
as one of several ranks (``autotune.runtime.ranks.start_ranks``); SPEC is a
``autotune.trials.spec.TrialSpec``. It writes one JSON object per line (an event of
``autotune.trials.events``) to the events file named in the spec;
the tuner reads them to follow progress, prune, and classify failures. Only rank 0
reports measurements; every rank reports errors.

``main`` calls ``ranks.bootstrap()`` before anything imports torch: this process may be
the ranks' launcher, which never needs torch, and a rank's cores must be pinned before
torch's OpenMP runtime reads them. Hence nothing at this module's top imports torch, and
the runtime's modules (which do) are imported in the functions, all called after it.
"""
from __future__ import annotations

import dataclasses
import gc
import json
import os
import resource
import statistics
import sys
import time
import traceback
from typing import TYPE_CHECKING

import psutil

from autotune.runtime import ranks
from autotune.runtime.json_value import JsonObject
from autotune.runtime.knobs import Device, Precision
from autotune.runtime.stepper import fault_step
from autotune.trials import peak_memory, proctree
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
from autotune.trials.failure import classify, script_fault
from autotune.trials.gate_runs import printed_training, scored_training, trajectory
from autotune.trials.protocol import Failure, Measurement, Mode
from autotune.trials.spec import TrialSpec

if TYPE_CHECKING:
    from autotune.runtime.session import ProcessSetup, Session
    from autotune.trials.training import TrainingSession


class Events:
    def __init__(self, path: str, rank: int) -> None:
        self.path, self.rank = path, rank

    def emit(self, event: TrialEvent, *, all_ranks: bool = False) -> None:
        """Write ``event``, stamped with this rank and the time, as one line."""
        if self.rank != 0 and not all_ranks:
            return
        line = json.dumps(dataclasses.replace(event, rank=self.rank, t=time.time()).to_json())
        # One write per line with O_APPEND keeps lines from several ranks whole.
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)


def probe_step_facts(session: TrainingSession) -> JsonObject:
    from autotune.runtime.facts import step_facts
    from autotune.runtime.session import Session
    from autotune.trials.script_session import ScriptSession
    from autotune.trials.step_facts import utilisation_facts

    if isinstance(session, ScriptSession):  # what the script runs with, read from inside its training
        return {**session.facts(), "loader_worker_pids": [c.pid for c in psutil.Process().children()]}
    assert isinstance(session, Session)
    _, facts = step_facts(session)
    return {**facts, "loader_worker_pids": [c.pid for c in psutil.Process().children()],
            "utilisation": utilisation_facts(session, settle=settle)}


def warm_up(session: TrainingSession, spec: Measurement, events: Events) -> tuple[float, float]:
    """Warm-up steps (the first one carries compile and lazy init): the first step's
    seconds and a steady step's, the slowest rank's."""
    dist = session.dist
    warmup = max(2, spec.warmup_steps)
    first_s, _ = session.run_steps(1)
    events.emit(BeatEvent(step=1))
    events.emit(FactsEvent(probe_step_facts(session)))
    step_times = []
    for i in range(warmup - 1):
        dt, _ = session.run_steps(1)
        step_times.append(dt)
        events.emit(BeatEvent(step=i + 2))
    # Every rank must run the same number of steps per window, or one rank waits in
    # all-reduce for a step the others never take: agree on the slowest rank's estimate.
    return first_s, dist.agree_max(statistics.median(step_times))


def calibrate(session: TrainingSession, spec: Measurement, events: Events) -> int:
    """Warm up, then the number of steps that makes a window of about window_s."""
    first_s, step_s = warm_up(session, spec, events)
    steps = int(min(spec.max_window_steps, max(1, round(spec.window_s / step_s))))
    events.emit(WarmupEvent(first_step_s=first_s, step_s=step_s, steps_per_window=steps))
    return steps


def settle(timeout_s: float = 5.0) -> None:
    """Wait until this process's DataLoader workers stop working: after a window they
    go on filling their prefetch queue, and in verification that work would land in the
    next configuration's window and slow it, most of all a baseline without workers."""
    me = psutil.Process()

    def cpu() -> float:
        total = 0.0
        for child in me.children(recursive=True):
            try:
                t = child.cpu_times()
                total += t.user + t.system
            except psutil.Error:
                pass
        return total

    last, deadline = cpu(), time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        time.sleep(0.1)
        now = cpu()
        if now - last < 0.01:  # under 10% of a core over the last 100 ms: idle
            return
        last = now


def lead_in(session: TrainingSession) -> None:
    """A settled process starts with a full prefetch queue: batches loaded for free while
    others measured. Untimed steps use them up, so what follows runs at the steady state."""
    loader = session.loader
    session.run_steps((loader.prefetch_factor or 2) * loader.num_workers)


def size_window(session: TrainingSession, spec: Measurement, *, settled: bool) -> int:
    """Steps per served window, from two steps timed now, agreed by all ranks: the warm-up's
    step time may come from a warm-up beside another process's start (verification starts
    them in overlap), while nothing else runs when the first window is asked."""
    if settled:
        lead_in(session)
    step_s = session.dist.agree_max(statistics.median(session.run_steps(1)[0] for _ in range(2)))
    return int(min(spec.max_window_steps, max(1, round(spec.window_s / step_s))))


def window(session: TrainingSession, steps: int, index: int, events: Events, *,
           settled: bool = False) -> tuple[float, list[float]]:
    if settled:
        lead_in(session)
    # Each rank reads a served window's command on its own: without meeting first, rank
    # 0's clock would include waiting in the first all-reduce for the last rank to read it.
    session.dist.barrier()
    dt, losses = session.run_steps(steps)
    value = steps * session.global_batch / dt
    if settled:
        settle()
    events.emit(WindowEvent(i=index, samples_per_s=value, seconds=dt, steps=steps))
    return value, losses


def finish(session: TrainingSession, values: list[float], losses: list[float], *,
           faults_per_step: float | None = None) -> DoneEvent:
    """A measurement's DONE event."""
    from autotune.runtime.facts import cuda_memory

    q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    # the rank that holds the most: a limit per rank (per GPU) binds there first
    rank_peak_mb = session.dist.agree_max(peak_memory.peak_mb(session.dist.device))
    cuda = cuda_memory(session.dist.device)
    return DoneEvent(
        mode=Mode.MEASURE,
        value=statistics.median(values),
        values=values,
        iqr=q[2] - q[0],
        peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        rank_peak_mb=rank_peak_mb,
        cuda_peak_mb=cuda.peak_mb,
        cuda_total_mb=cuda.total_mb,
        losses=losses,
        minor_faults_per_step=faults_per_step,
    )


def measure(session: TrainingSession, spec: Measurement, events: Events) -> DoneEvent:
    steps = calibrate(session, spec, events)
    values, losses = [], []
    # Minor page faults in the windows: a process's malloc state (glibc's most of all)
    # decides how many a step pays, and a configuration run after another in one process
    # may pay fewer than a fresh process does.
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for w in range(spec.windows):
        value, window_losses = window(session, steps, w, events)
        values.append(value)
        losses.extend(window_losses)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    return finish(session, values, losses, faults_per_step=faults / (steps * spec.windows))


def profile(session: Session, spec: Measurement, events: Events) -> DoneEvent:
    """Warm up as a measurement does, then ``runtime.profile``'s window: where the step goes,
    and the window's samples/s (slowed by the profiler: not a measurement)."""
    from autotune.runtime.profile import profiled_window
    from autotune.runtime.step_profile import StepProfile
    calibrate(session, spec, events)
    beat = BeatEvent(step=max(2, spec.warmup_steps) + 1, phase="profile")  # the hang watch's, before the window
    shares, steps, seconds = profiled_window(session, warmed=lambda: events.emit(beat))
    return DoneEvent(mode=Mode.PROFILE, step_profile=StepProfile.from_json(shares) if shares else None,
                     samples_per_s=steps * session.global_batch / seconds if seconds > 0 else None)


def read_from(control: str, offset: int) -> str:
    """What the tuner appended to a control file past ``offset`` (nothing before it exists)."""
    try:
        with open(control) as f:
            f.seek(offset)
            return f.read()
    except FileNotFoundError:
        return ""


def serve(session: TrainingSession, spec: Measurement, control: str, events: Events) -> None:
    """Warm up, then run one window per command appended to the control file, so the
    tuner can alternate windows of several live configurations (verification); the
    windows are sized at the first (``size_window``).
    On a GPU the warm-up waits for a first command (``WARM``): processes set up side by
    side, but each one's first steps (cuDNN's algorithm search, a compile's autotuning and
    CUDA-graph capture, all timed on the device) run while no other process uses it.
    Every rank reads the commands itself: no collective is left waiting while idle."""
    offset = 0
    if session.dist.device.type == Device.CUDA:
        _, offset = next_line(control, offset)
    first_s, step_s = warm_up(session, spec, events)
    events.emit(WarmupEvent(first_step_s=first_s, step_s=step_s))
    settled = session.loader.num_workers > 0
    if settled:
        settle()
    events.emit(ReadyEvent())
    steps = None
    values: list[float] = []
    losses: list[float] = []
    while True:
        text = read_from(control, offset)
        complete = text[: text.rfind("\n") + 1]
        offset += len(complete)
        commands = complete.split()
        if not commands:
            time.sleep(0.02)  # idle between windows: a cheap poll, not a spin
            continue
        for _ in commands:
            if steps is None:
                steps = size_window(session, spec, settled=settled)
            value, window_losses = window(session, steps, len(values), events, settled=settled)
            values.append(value)
            losses.extend(window_losses)


def run_spec(spec: TrialSpec, setup: ProcessSetup | None, events: Events) -> ProcessSetup | None:
    """Train and measure one configuration as its spec says, in this process's ``setup``
    (a model file's, made here for the process's first configuration); returns the setup. A
    spec with a ``next`` control file leaves the process ready for the next configuration
    before it reports, so that its teardown is over before anything else measures."""
    from autotune.runtime.facts import process_facts

    started = time.perf_counter()
    reused = setup is not None
    session, setup, process_s = open_session(spec, setup)
    events.emit(SetupEvent(
        seconds=time.perf_counter() - started,
        # of which the process's own setup (the model file's import, build_dataset), the
        # same for every configuration and paid once by a warm process's first one
        process_s=0.0 if reused else process_s,
        world=session.dist.world,
        backend=session.dist.backend,
        pid=os.getpid(),
        warm=reused,
        process=process_facts(),
    ))
    done = run_mode(session, spec, events)
    if spec.next:
        session.release()
    events.emit(done)
    return setup


def open_session(spec: TrialSpec, setup: ProcessSetup | None
                 ) -> tuple[TrainingSession, ProcessSetup | None, float]:
    """The configuration's training: the model file's ``Session`` in ``setup`` (made here for
    the process's first configuration), or the user's script run by its way in's stepper (one
    configuration a process); with the setup and the seconds the process's own setup took."""
    from autotune.runtime.session import ProcessSetup, Session
    from autotune.trials.script_session import ScriptSession

    started = time.perf_counter()
    cfg, mode = spec.knobs, spec.mode.mode
    if spec.script is not None:
        out_dir = os.path.join(os.path.dirname(spec.events), "script-output")
        session = ScriptSession(spec.model_file, cfg, spec.script, out_dir=out_dir)
        return session, None, time.perf_counter() - started
    # The numerics check compares fp32 trajectories in true IEEE fp32 (the reference's
    # and an fp32 candidate's alike), not with the TF32 convolutions PyTorch allows.
    strict_fp32 = (mode in (Mode.TRAJECTORY, Mode.QUALITY)
                   and cfg.get("precision", Precision.FP32) == Precision.FP32)
    if setup is None:
        setup = ProcessSetup(spec.model_file, cfg, seed=spec.seed, strict_fp32=strict_fp32)
        # The setup (the model file, its data set, torch) lives as long as the process: the
        # collections after each configuration (``Session.release``) need not walk it again,
        # as a process forked from the warm interpreter already does not walk torch
        gc.freeze()
    process_s = time.perf_counter() - started
    peak_memory.reset_host_peak()  # this configuration's peak, not an earlier one's in this process
    return Session(spec.model_file, cfg, seed=spec.seed, strict_fp32=strict_fp32, setup=setup), setup, process_s


def run_mode(session: TrainingSession, spec: TrialSpec, events: Events) -> DoneEvent:
    """What the spec's mode asks of ``session``: a measurement, a gate's training, served
    windows (until the trial is ended) or a profiled window (a model file's)."""
    from autotune.runtime.session import Session
    from autotune.trials.script_session import ScriptSession

    mode, measurement = spec.mode.mode, spec.measure
    if mode is Mode.TRAJECTORY or mode is Mode.QUALITY:
        if spec.mode.steps is None:
            raise ValueError(f"a {mode} trial's spec names no steps")
        if mode is Mode.TRAJECTORY:
            return trajectory(session, spec.mode.steps, spec.mode.guard)
        if isinstance(session, ScriptSession) and session.printed is not None:
            return printed_training(session, session.printed, spec.mode.steps, spec.mode.guard,
                                    over=f"{spec.events}.over")
        return scored_training(session, spec.mode.steps, spec.mode.evaluate_at, spec.mode.guard)
    if mode is Mode.SERVE:
        if spec.control is None:
            raise ValueError("a served trial's spec names no control file")
        serve(session, measurement, spec.control, events)
        raise AssertionError("a served trial runs until it is ended")
    if mode is Mode.PROFILE:
        if not isinstance(session, Session):
            raise ValueError("a script's trial is not profiled (its step runs inside the user's own training)")
        return profile(session, measurement, events)
    return measure(session, measurement, events)


def next_line(control: str, offset: int) -> tuple[str, int]:
    """Wait for the next line of the control file (a warm process's next configuration's
    spec, a served trial's first command). Returns it and the offset after it."""
    while True:
        text = read_from(control, offset)
        end = text.find("\n")
        if end >= 0:
            return text[:end].strip(), offset + end + 1
        time.sleep(0.02)  # idle between configurations: a cheap poll


def log_to(path: str) -> None:
    """This process's output (and its future DataLoader workers') into ``path``: each
    configuration a warm process measures keeps a log of its own."""
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def main(argv: list[str]) -> int:
    ranks.bootstrap()
    proctree.die_with_parent()  # a rank must not outlive its launcher (start_ranks or the tuner)
    rank = int(os.environ.get("RANK", "0"))
    spec_path, offset = argv[0], 0
    setup: ProcessSetup | None = None  # a model file's: a script's process trains one configuration
    while True:
        with open(spec_path) as f:
            data = json.load(f)
        events = Events(data["events"], rank)
        try:
            spec = TrialSpec.from_json(data)
            setup = run_spec(spec, setup, events)
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt):
                raise
            kind = classify(exc, data["model_file"])
            message = f"{type(exc).__name__}: {exc}"
            if kind is Failure.USER_ERROR and data.get("script") is not None:
                message = script_fault(exc, data["model_file"], fault_step(exc))
            events.emit(ErrorEvent(kind=kind, message=message[:2000],
                                   traceback=traceback.format_exc()[-8000:]),
                        all_ranks=True)
            traceback.print_exc()
            # As on success, and more so here: interpreter teardown with a live process group
            # can stall (NCCL, while peers wait in a collective), and a rank that never exits
            # leaves its error to be reported as the hang that follows. Teardown would have
            # ended this process's DataLoader workers; without it they are ended here: one
            # that failed at the first batch was gone before the tuner could record it.
            # A warm process ends too: whatever failed may have left it unfit to measure.
            proctree.reap_orphans()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(3)
        if not spec.next:
            break  # a warm process waits for its next configuration until it is ended
        spec_path, offset = next_line(spec.next, offset)
        log = TrialSpec.read(spec_path).log
        assert log is not None, "a warm process's next spec names its log"
        log_to(log)
    # The result is written. Tearing down gloo and torch's threads adds nothing to a
    # trial and can abort ("terminate called without an active exception", seen in
    # CI on a 2-rank trial): leave without it.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
