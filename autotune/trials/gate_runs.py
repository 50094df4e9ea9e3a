"""The verification gates' runs, in a trial's worker: a trajectory of losses (the numerics
check) and a training scored by the user's evaluate() along the way and at its end (the
quality check, which reads the losses too), or, for a plain loop, by the metric its script
prints (``printed_training``)."""
from __future__ import annotations

import math
import os
import random
from typing import TYPE_CHECKING

from autotune.runtime.knobs import Device
from autotune.trials.events import DoneEvent
from autotune.trials.protocol import Mode
from autotune.trials.spec import LossGuard

if TYPE_CHECKING:
    from autotune.trials.printed import PrintedScores
    from autotune.trials.script_session import ScriptSession
    from autotune.trials.training import TrainingSession


def trajectory(session: TrainingSession, steps: int, guard: LossGuard | None = None) -> DoneEvent:
    """Losses of a fixed number of steps, averaged over ranks: the numerics check. Ends
    where a loss strays past ``guard``."""
    losses: list[float] = []
    for step in range(steps):
        losses.append(float(session.dist.mean(session.step())))
        if guard is not None and guard.strays(step, losses[-1]):
            break
    return DoneEvent(mode=Mode.TRAJECTORY, losses=losses)


def score(session: TrainingSession) -> float | None:
    """The user's evaluate() of the model as trained so far (None off rank 0). The
    training goes on afterwards as if it had not run: its random draws (dropout,
    sampling) are given back, and the model is in the mode it was."""
    import torch

    with session.evaluation_model() as model:
        if model is None:
            return None
        training = model.training
        cuda = [session.dist.device] if session.dist.device.type == Device.CUDA else []
        state = random.getstate()
        with torch.random.fork_rng(devices=cuda):
            value = float(session.user.evaluate(model))
        random.setstate(state)
        model.train(training)
        return value


def scored_training(session: TrainingSession, steps: int, evaluate_at: tuple[int, ...] = (),
                    guard: LossGuard | None = None) -> DoneEvent:
    """A trajectory, then the user's evaluate() on rank 0 (the quality check reads the
    score, the numerics check the losses); with ``evaluate_at``, evaluate() also scores the
    model before each of those steps. No score after a loss that is not finite, or one
    that strays past ``guard``: the training stops there."""
    losses: list[float] = []
    evaluations: list[tuple[int, float]] = []
    stray = False
    points = {s for s in evaluate_at if 0 <= s < steps}
    # The losses are the ranks' mean: every rank takes the scoring branches, as gathering
    # a sharded model's weights for evaluate() needs.
    for step in range(steps):
        if step in points and all(math.isfinite(v) for v in losses):
            value = score(session)
            if value is not None:
                evaluations.append((step, value))
        losses.append(float(session.dist.mean(session.step())))
        stray = not math.isfinite(losses[-1]) or (guard is not None and guard.strays(step, losses[-1]))
        if stray:  # nothing left to score: the numerics check rejects it
            break
    metric = score(session) if not stray else None
    return DoneEvent(mode=Mode.QUALITY, losses=losses, metric=metric,
                     evaluations=evaluations if metric is not None else [])


def printed_training(session: ScriptSession, printed: PrintedScores, steps: int,
                     guard: LossGuard | None = None, *, over: str | None = None) -> DoneEvent:
    """A plain loop's scored training: its script run to the first print of ``--metric``'s
    line once ``steps`` steps are taken (to its end where it prints none later, or to its
    first write outside the trial's folder); the last number printed is its score, those
    printed before are its scores along the way (``trials.printed``). No score after a loss
    that is not finite, or one that strays past ``guard``: the training stops there.

    As several ranks, rank 0's print is the score (a DDP script prints from rank 0 only), and
    where rank 0 stops, every rank stops: rank 0 marks the file ``over`` as it leaves, and the
    others, whatever their scripts are doing by then (past their training, or waiting in a
    collective rank 0 will not join), end their training there."""
    if session.dist.enabled and session.dist.rank != 0:
        return _until_rank_zero_is_over(session, printed, over)
    try:
        return _printed_training(session, printed, steps, guard)
    finally:
        if over is not None and session.dist.enabled:
            with open(over, "w"):
                pass


def _printed_training(session: ScriptSession, printed: PrintedScores, steps: int,
                      guard: LossGuard | None) -> DoneEvent:
    from autotune.runtime.stepper import ScriptEnded

    losses: list[float] = []
    printed.stop_after = steps
    printed.guard_writes(session.folder)
    try:
        while True:
            _, got = session.run_steps(1)
            losses.extend(got)
            if not math.isfinite(losses[-1]) or (guard is not None and guard.strays(len(losses) - 1, losses[-1])):
                return DoneEvent(mode=Mode.QUALITY, losses=losses)
    except ScriptEnded as exc:  # stopped at the print, or the script's own end
        if exc.code not in (None, 0):
            raise
    if not printed.scores:
        raise ValueError(printed.missing(len(losses)))
    *along, (_, last) = printed.scores
    return DoneEvent(mode=Mode.QUALITY, losses=losses, metric=last, evaluations=along)


def _until_rank_zero_is_over(session: ScriptSession, printed: PrintedScores, over: str | None) -> DoneEvent:
    """A rank other than 0 of a printed training: its steps, until rank 0's training is over.
    What its own script raises once rank 0 has left (a peer gone from a collective) is that
    end, not its fault; its own end before rank 0's waits for rank 0's."""
    import threading
    import time

    from autotune.runtime.stepper import ScriptEnded

    if over is None:
        raise ValueError("a printed training of several ranks names no file for rank 0's end")
    printed.guard_writes(session.folder)
    done = threading.Event()

    def watch() -> None:
        while not done.wait(0.05):
            if os.path.exists(over):
                session.stepper.ended_elsewhere("rank 0's training is over")
                return

    threading.Thread(target=watch, daemon=True, name="rank-0-over").start()
    losses: list[float] = []
    try:
        while True:
            _, got = session.run_steps(1)
            losses.extend(got)
    except BaseException as exc:
        if not (isinstance(exc, ScriptEnded) and exc.code in (None, 0)) and not os.path.exists(over):
            time.sleep(1.0)  # a peer gone from a collective: rank 0 may be leaving now
            if not os.path.exists(over):
                raise
    while not os.path.exists(over):  # its script ended first: rank 0 still trains or evaluates
        time.sleep(0.05)
    done.set()
    return DoneEvent(mode=Mode.QUALITY, losses=losses)
