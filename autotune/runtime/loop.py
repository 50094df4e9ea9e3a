"""train_tuned.py's training loop: checkpoints (with every random state, for an exact
resume), metrics, stop requests (SIGTERM, SIGINT), evaluate() at epoch ends, and a clock
of training alone."""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import random
import signal
import sys
import time
from collections.abc import Iterator
from typing import Any, TypedDict

import torch

from . import memory_knobs
from .distributed import Distributed
from .facts import process_facts, process_peak_mb, step_facts
from .json_value import JsonObject
from .knobs import ConfigDict, Device
from .model import check_finite, unwrap_model
from .session import Session

CHECKPOINT_NAME = "step-{step:09d}.pt"
STOP_SIGNALS = ("SIGTERM", "SIGINT")
# With several ranks, a stop request is agreed on every this many steps: the ranks must
# stop after the same step, and a collective every step would slow what was tuned.
STOP_CHECK_EVERY = 10


class RngState(TypedDict, total=False):
    """Every random generator a training step may draw from, as a checkpoint holds them:
    numpy's where it was imported, the GPU's on CUDA."""

    python: tuple[Any, ...]
    torch: torch.Tensor
    numpy: Any  # numpy.random.get_state()'s tuple; numpy is the user's, not a dependency
    cuda: torch.Tensor


def rng_state(device: torch.device) -> RngState:
    """Every random generator a training step may draw from, as saved in a checkpoint."""
    state: RngState = {"python": random.getstate(), "torch": torch.get_rng_state()}
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        state["numpy"] = numpy.random.get_state()
    if device.type == Device.CUDA:
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: RngState, device: torch.device) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    numpy = sys.modules.get("numpy")
    if numpy is not None and "numpy" in state:
        numpy.random.set_state(state["numpy"])
    if device.type == Device.CUDA and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


def latest_checkpoint(folder: str) -> str | None:
    """The checkpoint of the most steps in ``folder``; None when there is none."""
    if not os.path.isdir(folder):
        return None
    names = sorted(n for n in os.listdir(folder) if n.startswith("step-") and n.endswith(".pt"))
    return os.path.join(folder, names[-1]) if names else None


def read_checkpoint(path: str) -> dict[str, Any]:
    """A checkpoint this script wrote (it holds RNG states, so it is not weights-only)."""
    return torch.load(path, map_location=Device.CPU.value, weights_only=False)


class Checkpoints:
    """Where and when rank 0 saves: every ``every`` steps (0: at each epoch's end), at the
    last step, and when a stop signal arrives; the newest ``keep`` are kept (0: all).
    Every rank takes part (their RNG states are gathered)."""

    def __init__(self, folder: str | None, *, every: int, keep: int) -> None:
        self.folder, self.every, self.keep = folder, every, keep

    def due(self, step: int, *, per_epoch: int | None, last: bool) -> bool:
        if self.folder is None:
            return False
        if last:
            return True
        if self.every:
            return step % self.every == 0
        return per_epoch is not None and step % per_epoch == 0

    def save(self, session: Session, *, step: int, config: ConfigDict) -> str | None:
        states: list[Any] = [rng_state(session.dist.device)]
        if session.dist.enabled:
            states = [None] * session.dist.world
            torch.distributed.all_gather_object(states, rng_state(session.dist.device))
        model = unwrap_model(session.model)
        if memory_knobs.is_sharded(model):
            # Gathered from every rank's share into the format an unsharded run saves: the
            # user's names, loadable into the plain model and its plain optimizer.
            weights = memory_knobs.full_model_state(model)
            optimizer = memory_knobs.full_optimizer_state(model, session.optimizer)
        elif session.dist.rank == 0:
            weights, optimizer = model.state_dict(), session.optimizer.state_dict()
        if session.dist.rank != 0 or self.folder is None:
            return None
        os.makedirs(self.folder, exist_ok=True)
        path = os.path.join(self.folder, CHECKPOINT_NAME.format(step=step))
        state = {"step": step, "model": weights,
                 "optimizer": optimizer,
                 "scaler": session.scaler.state_dict() if session.scaler is not None else None,
                 "rng": states, "world": session.dist.world, "config": config}
        tmp = f"{path}.{os.getpid()}.tmp"
        torch.save(state, tmp)
        os.replace(tmp, path)  # a kill mid-save leaves the previous checkpoint intact
        if self.keep:
            names = sorted(n for n in os.listdir(self.folder) if n.startswith("step-") and n.endswith(".pt"))
            for old in names[: -self.keep]:
                os.remove(os.path.join(self.folder, old))
        return path


def restore(session: Session, state: dict[str, Any]) -> list[str]:
    """Load a checkpoint into a session built at its step; returns warnings."""
    warnings = []
    model = unwrap_model(session.model)
    if memory_knobs.is_sharded(model):
        memory_knobs.load_full_state(model, session.optimizer, model_state=state["model"],
                               optimizer_state=state["optimizer"])
    else:
        model.load_state_dict(state["model"])
        session.optimizer.load_state_dict(state["optimizer"])
    if session.scaler is not None and state.get("scaler"):
        session.scaler.load_state_dict(state["scaler"])
    states = state["rng"]
    if len(states) != session.dist.world:
        warnings.append(f"the checkpoint was saved by {len(states)} rank(s), this run has "
                        f"{session.dist.world}: random streams continue from rank 0's")
    set_rng_state(states[session.dist.rank] if session.dist.rank < len(states) else states[0],
                  session.dist.device)
    return warnings


class Metrics:
    """Training metrics as JSON lines (appended: a resumed run continues the file), and
    TensorBoard scalars where a log dir is given and tensorboard is installed."""

    def __init__(self, path: str | None, *, tensorboard: str | None, enabled: bool) -> None:
        self.file = None
        self.writer = None
        if not enabled:
            return
        if path:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            self.file = open(path, "a")  # noqa: SIM115  (held for the run, closed in close())
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                print("warning: --tensorboard needs the tensorboard package (pip install tensorboard); "
                      "metrics go to the JSON lines only", file=sys.stderr, flush=True)
            else:
                self.writer = SummaryWriter(tensorboard)

    def write(self, step: int, **values: Any) -> None:
        if self.file is not None:
            self.file.write(json.dumps({"step": step, "time": time.time(), **values}) + "\n")
            self.file.flush()
        if self.writer is not None:
            for key, value in values.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    self.writer.add_scalar(key, value, step)

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
        if self.writer is not None:
            self.writer.close()


class StopRequest:
    """SIGTERM or SIGINT (a preempted job, Ctrl-C) asks the loop to stop after the
    current step and save; a second one is left to the default action."""

    def __init__(self) -> None:
        self.signum = 0
        for name in STOP_SIGNALS:
            signal.signal(getattr(signal, name), self._handle)

    def _handle(self, signum: int, frame: object) -> None:
        self.signum = signum
        signal.signal(signum, signal.SIG_DFL)

    def agreed(self, session: Session, step: int) -> int:
        """The signal every rank stops for after ``step`` (0: go on)."""
        if not session.dist.enabled:
            return self.signum
        if step % STOP_CHECK_EVERY:
            return 0
        return int(session.dist.agree_max(float(self.signum)))


def evaluate(session: Session) -> float | None:
    """The user's evaluate(model) on rank 0: the model unwrapped (a sharded one's weights
    gathered into a plain copy), on its training device, back in training mode after it.
    The other ranks wait for it in a barrier, on the
    host: waiting in the next step's all-reduce instead, they would be torn down by
    NCCL's watchdog during an evaluation longer than its timeout, and rank 0's next
    step would be timed against ranks that had already taken it."""
    user_evaluate = getattr(session.user, "evaluate", None)
    if user_evaluate is None:
        return None
    metric = None
    with session.evaluation_model() as model:
        if model is not None:
            try:
                metric = float(user_evaluate(model))
            finally:
                model.train()
    session.dist.barrier()
    return metric


class TrainClock:
    """The clock of train()'s samples/s: from the end of the warm-up steps to the last
    step, less what ``paused()`` kept out of it (evaluate(), checkpoint saves), so the
    rate is that of training alone, whatever the number of epoch ends a run crosses.
    Each edge waits for the device: work queued before a pause is training's, work
    queued inside it is not."""

    def __init__(self, dist: Distributed) -> None:
        self.dist = dist
        self.start = time.perf_counter()
        self.excluded = 0.0

    def restart(self) -> None:
        self.dist.synchronize()
        self.start = time.perf_counter()
        self.excluded = 0.0

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        self.dist.synchronize()
        began = time.perf_counter()
        try:
            yield
        finally:
            self.dist.synchronize()
            self.excluded += time.perf_counter() - began

    def elapsed(self) -> float:
        self.dist.synchronize()
        return time.perf_counter() - self.start - self.excluded


def train(session: Session, *, total: int, start: int, config: ConfigDict, checkpoints: Checkpoints,
          metrics: Metrics, log_every: int, report: str | None,
          evaluate_each_epoch: bool = True) -> int:
    """Train from step ``start`` (a resumed run) to ``total``; returns the exit code:
    0, or 128 + the signal after a stop request was saved. ``evaluate_each_epoch`` False
    skips evaluate() at epoch ends (a timed comparison of scripts does not need it)."""
    rank0 = session.dist.rank == 0
    per_epoch = session.per_epoch
    stop = StopRequest()
    warm = start + min(3, max(0, total - start - 1))  # steps before the clock starts (compile)
    losses: list[float] = []
    pending: list[torch.Tensor] = []
    facts: JsonObject | None = None
    clock = TrainClock(session.dist)
    stopped = 0
    step = start
    while step < total:
        step += 1
        if step == start + 1 and report:
            # The first step, with hooks that record what each knob did here, the way
            # autotune's trials record it.
            loss, first = step_facts(session)
            facts = {**first, **dataclasses.asdict(process_facts())}
            pending.append(loss)
        else:
            pending.append(session.step())
        if step == warm:
            clock.restart()
        epoch = step // per_epoch if per_epoch else None
        epoch_end = per_epoch is not None and step % per_epoch == 0
        stopped = stop.agreed(session, step)
        last = step == total or bool(stopped)
        if step % log_every == 0 or last or epoch_end:
            losses.extend(check_finite(pending))
            pending = []
            if rank0 and (step % log_every == 0 or last):
                print(f"step {step}/{total}  loss {losses[-1]:.4f}", flush=True)
                metrics.write(step, loss=losses[-1], epoch=step / per_epoch if per_epoch else None)
        if epoch_end and evaluate_each_epoch:
            with clock.paused():
                metric = evaluate(session)
            if metric is not None:
                print(f"epoch {epoch}  evaluate {metric:.4f}", flush=True)
                metrics.write(step, evaluate=metric, epoch=epoch)
        if checkpoints.due(step, per_epoch=per_epoch, last=last):
            with clock.paused():
                path = checkpoints.save(session, step=step, config=config)
            if path:
                print(f"saved {path}", flush=True)
                metrics.write(step, checkpoint=path)
        if stopped:
            break
    elapsed = clock.elapsed()
    # the busiest rank's (collective: every rank reaches here), for autotune's memory report
    rank_peak_mb = session.dist.agree_max(process_peak_mb(session.dist.device))
    timed = step - warm
    samples_per_s = timed * session.global_batch / elapsed if timed > 0 and elapsed > 0 and not stopped else None
    if rank0:
        if stopped:
            where = f"; resume with --resume {checkpoints.folder}" if checkpoints.folder else ""
            print(f"stopped by {signal.Signals(stopped).name} after step {step}{where}", flush=True)
        elif samples_per_s:
            print(f"{samples_per_s:.1f} samples/s over {timed} steps", flush=True)
        if report:
            with open(report, "w") as f:
                json.dump({"steps": step, "first_step": start + 1, "timed_steps": timed,
                           "samples_per_s": samples_per_s, "losses": losses, "facts": facts,
                           "rank_peak_mb": rank_peak_mb, "stopped_by": stopped or None}, f)
    metrics.close()
    return 128 + stopped if stopped else 0
