"""How long the gates' scored trainings are: as far into the user's own training as one
gate training's price holds, and never past it.

A verdict taken where seeds still disagree wildly is a verdict on noise, and one taken past
the user's whole job judges a training they never run. The user's own training is known
from a script's arguments (the Trainer's ``max_steps`` or ``num_train_epochs``, Lightning's
``max_steps`` or ``max_epochs``) or a model file's planned run (``--train-steps``,
``--epochs``); where it is, a gate training goes that far where that costs no more than
``GATE_TRAINING_S`` at the slowest rate the search measured, and as far as that buys where it
costs more. Where it is not known, ``Settings.quality_samples`` (6,400 samples)."""
from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from autotune.task.load import Task
    from autotune.task.objective import PlannedRun

# What one gate training may take, at the slowest samples/s the search measured, where the
# user's own training is longer: a verdict trains two of them a seed, two seeds or more.
GATE_TRAINING_S = 30.0


@dataclasses.dataclass(frozen=True)
class OwnTraining:
    """The user's training: ``samples`` long, as they set it (``words``)."""

    samples: int
    words: str


def _number(values: object, key: str) -> float | None:
    value = values.get(key) if isinstance(values, dict) else None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 else None


def own_training(task: Task, plan: PlannedRun | None) -> OwnTraining | None:
    """How long the user's own training is, where their script or plan says; None where not
    (a model file without a plan, a Lightning script that sets neither ``max_steps`` nor
    ``max_epochs``, a data set without a length)."""
    script = task.script
    if script is None:
        return OwnTraining(plan.samples, plan.describe()) if plan is not None else None
    values = dict(script.user_values)
    steps_key, epochs_key = script.length_keys
    steps, epochs = _number(values, steps_key), _number(values, epochs_key)
    batch = task.batch_size
    if steps is not None:
        return OwnTraining(int(steps) * batch, f"{steps_key}={int(steps):,} at batch {batch}")
    if epochs is not None and task.dataset_len:
        return OwnTraining(math.ceil(epochs * task.dataset_len),
                           f"{epochs_key}={epochs:g} of {task.dataset_len:,} samples")
    return None


def gate_samples(own: OwnTraining | None, *, default: int, slowest: float | None,
                 price_s: float = GATE_TRAINING_S) -> int:
    """The samples of a gate's scored training: ``own``'s whole length where ``price_s`` at
    ``slowest`` samples/s buys it, else what it buys; ``default`` where ``own`` is not known,
    and where no rate is (never past ``own``)."""
    if own is None:
        return default
    affordable = int(price_s * slowest) if slowest else default
    return max(1, min(own.samples, affordable))


def described(samples: int, own: OwnTraining | None, *, batch_size: int | None = None) -> str:
    """The length a verdict was taken at, against the user's own training (``batch_size``:
    the batch the training ran at, whose step may carry it past the user's length)."""
    if own is None:
        return f"{samples:,} samples (your training's own length is not known here)"
    if batch_size is not None and samples >= own.samples + batch_size:
        return (f"{samples:,} samples, past your training's {own.samples:,} ({own.words}): the numerics check's "
                f"steps at batch {batch_size} are the least a verdict trains")
    if samples >= own.samples:
        return f"{samples:,} samples, your training's whole length ({own.words})"
    return (f"{samples:,} samples, {samples / own.samples:.0%} of your training's {own.samples:,} ({own.words}): "
            f"as far as {GATE_TRAINING_S:g} s a training holds")


def within(samples: int, own: OwnTraining | None, *, batch_size: int) -> int:
    """``samples`` no further than ``own`` (one step of ``batch_size`` at least)."""
    return samples if own is None else max(batch_size, min(samples, own.samples))
