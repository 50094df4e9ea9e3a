"""A Hugging Face Trainer script run as its user runs it, with its ``TrainingArguments``
overridden and callbacks of ours in its ``Trainer``.

The check, every trial and the emitted ``run_tuned.py`` (which ships this file in
``tuned_runtime/``) run the user's script through ``run_script``: the very file, as
``__main__``, with its own command-line arguments. The Trainer is entered through the doors it
offers (``TrainerCallback``, ``Trainer.add_callback``, ``TrainerControl.should_training_stop``);
two things it offers no door for are done here, and only here:

- the overrides are set on every ``TrainingArguments`` just before its own ``__post_init__``
  validates it, whether the script builds it in code or ``HfArgumentParser`` does: they are
  checked as if the user had written them;
- our callbacks are added to every ``Trainer`` once its own ``__init__`` has run, and its
  ``training_step`` is wrapped to keep each step's loss (the Trainer sums its losses on the
  device between logging steps and shows only their rounded mean).

``Trainer.train`` is wrapped too: to see the line that calls it, and, in a process autotune
started, to end the script with its training (``script_end``): ``on_train_end`` comes before
the Trainer's last work, and a callback cannot stop the script's code after ``train()``.

They are wrappers that call the original, installed on the classes (subclasses inherit
them) for the life of the process. tests/test_hf_script.py runs them against the
transformers release the project installs.
"""
from __future__ import annotations

import dataclasses
import os
import runpy
import sys
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from . import script_ranks
from .stepper import Stepper

# The TrainingArguments fields that autotune reads from the user's arguments (their
# baseline) and may set (a configuration's knobs).
KNOB_FIELDS = (
    "per_device_train_batch_size", "gradient_accumulation_steps", "dataloader_num_workers",
    "dataloader_pin_memory", "dataloader_persistent_workers", "dataloader_prefetch_factor",
    "bf16", "fp16", "tf32", "torch_compile", "torch_compile_mode", "optim", "seed",
    "gradient_checkpointing", "use_cpu", "metric_for_best_model", "greater_is_better", "eval_strategy",
    "ddp_backend", "ddp_static_graph",
)
# How long the user's training is (read, never set: trials train until measured, the gates
# as far as ``autotune.verify.length`` says).
LENGTH_FIELDS = ("max_steps", "num_train_epochs")

# What a trial, or the check, sets whatever the configuration: in them the script saves
# nothing, pushes nothing, reports to nothing and evaluates only when a gate asks; its
# outputs go to the folder autotune gives it (``output_dir``, set beside these).
QUIET: dict[str, Any] = {
    "report_to": "none", "save_strategy": "no", "push_to_hub": False, "eval_strategy": "no",
    "load_best_model_at_end": False, "disable_tqdm": True, "hub_strategy": "end",
}
# A trial trains until autotune has measured it: a run longer than any measurement
# (the learning rate's schedule then barely moves within it).
ENDLESS_STEPS = 10**9


@dataclasses.dataclass
class Built:
    """Where the script built its arguments and its Trainer, and what it wrote in them."""

    user_values: dict[str, Any] = dataclasses.field(default_factory=dict)
    parsed: bool = False  # built by HfArgumentParser from the command line
    args_line: int | None = None  # the script's line that built them
    trainer: Any = None
    trainers: int = 0
    train_lines: list[int] = dataclasses.field(default_factory=list)


def _script_line(path: str) -> int | None:
    """The line of ``path`` in the current stack that is running now (innermost)."""
    path = os.path.abspath(path)
    for frame in reversed(traceback.extract_stack()):
        if frame.filename and os.path.abspath(frame.filename) == path:
            return frame.lineno
    return None


def _parsed_by_hf_argparser() -> bool:
    return any(f.filename.endswith(os.path.join("transformers", "hf_argparser.py"))
               for f in traceback.extract_stack())


def plain(value: Any) -> Any:
    """A TrainingArguments value as JSON holds it (its enums by value)."""
    value = getattr(value, "value", value)
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


def install(script: str, overrides: Mapping[str, Any],
            callbacks: Callable[[Any], Sequence[Any]] = lambda trainer: (),
            at_end: Callable[[], Any] | None = None) -> Built:
    """Wrap ``TrainingArguments.__post_init__`` (set ``overrides`` first), ``Trainer.__init__``
    (add ``callbacks(trainer)`` last) and ``Trainer.train`` (once its training has returned,
    ``at_end()``, which does not return: ``script_end``) for this process; returns
    what the script's run will have built, filled in as it builds it."""
    import transformers

    built = Built()
    arguments, trainer_class = transformers.TrainingArguments, transformers.Trainer
    post_init, init, train = arguments.__post_init__, trainer_class.__init__, trainer_class.train

    def __post_init__(self: Any) -> None:
        if not built.user_values:  # the script's first TrainingArguments is the one it trains with
            built.user_values = {k: plain(getattr(self, k)) for k in (*KNOB_FIELDS, *LENGTH_FIELDS)
                                 if hasattr(self, k)}
            built.parsed = _parsed_by_hf_argparser()
            built.args_line = _script_line(script)
        for key, value in overrides.items():
            setattr(self, key, value)
        post_init(self)

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        built.trainer, built.trainers = self, built.trainers + 1
        for callback in callbacks(self):
            self.add_callback(callback)

    def train_(self: Any, *args: Any, **kwargs: Any) -> Any:
        built.train_lines.append(_script_line(script) or 0)
        result = train(self, *args, **kwargs)
        if at_end is not None:
            at_end()  # nothing of the script after its training runs (script_end)
        return result

    arguments.__post_init__ = __post_init__
    trainer_class.__init__ = __init__
    trainer_class.train = train_
    return built


def keep_step_losses(trainer: Any, losses: list[float]) -> None:
    """Append each optimizer step's loss (its micro-batches' losses summed, as the Trainer
    sums them) to ``losses`` at the step's end (``StepLosses`` closes the step)."""
    step = trainer.training_step
    pending: list[Any] = []

    def training_step(*args: Any, **kwargs: Any) -> Any:
        loss = step(*args, **kwargs)
        pending.append(loss)
        return loss

    trainer.training_step = training_step
    trainer._autotune_pending_losses = pending  # read by StepLosses.close
    trainer._autotune_losses = losses


def close_step(trainer: Any) -> float:
    """The loss of the step that just ended (a device synchronize: it is read)."""
    pending = trainer._autotune_pending_losses
    value = float(sum(float(v) for v in pending)) if pending else float("nan")
    pending.clear()
    trainer._autotune_losses.append(value)
    return value


def run_script(path: str, argv: Sequence[str]) -> None:
    """Run the script as ``python path *argv`` would, in this process: its own folder first on
    the import path, ``__main__`` as its name."""
    path = os.path.abspath(path)
    sys.argv = [path, *argv]
    sys.path.insert(0, os.path.dirname(path))
    runpy.run_path(path, run_name="__main__")


def synchronize(trainer: Any) -> None:
    import torch

    device = trainer.args.device
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def trainer_facts(trainer: Any) -> dict[str, Any]:
    """The arguments as the Trainer runs with them, read from inside it: what a trial, the
    check and run_tuned.py --report record; with several ranks, what each rank's Trainer runs
    with (``ranks``: a collective, every rank calls it at the same point)."""
    import torch

    args = trainer.args
    rank = {"rank": int(args.process_index), "world_size": int(args.world_size), "threads": torch.get_num_threads(),
            "per_device_train_batch_size": int(args.per_device_train_batch_size)}
    return {"training_args": {k: plain(getattr(args, k)) for k in KNOB_FIELDS if hasattr(args, k)},
            "output_dir": str(args.output_dir), "report_to": [plain(r) for r in (args.report_to or [])],
            "save_strategy": plain(args.save_strategy), "world_size": int(args.world_size),
            "ranks": script_ranks.every_rank(rank)}


class HfStepper(Stepper):
    """A Hugging Face Trainer held at each ``on_step_end`` (a ``TrainerCallback``)."""

    def __init__(self, script: str, argv: Sequence[str], overrides: Mapping[str, Any]) -> None:
        super().__init__(script, argv, run_script)
        self.built = install(self.script, overrides, self._callbacks, at_end=self.training_over)

    @classmethod
    def for_trial(cls, script: str, argv: Sequence[str], overrides: Mapping[str, Any], *, source_module: str,
                  out_dir: str) -> Stepper:
        return cls(script, argv, {**QUIET, "output_dir": out_dir, "max_steps": ENDLESS_STEPS, **overrides})

    def _callbacks(self, trainer: Any) -> Sequence[Any]:
        from transformers import TrainerCallback

        if self.built.trainers > 1:
            return ()
        keep_step_losses(trainer, [])
        stepper = self

        class StepByStep(TrainerCallback):
            def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
                stepper.begin(kwargs.get("train_dataloader"))

            def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
                loss = close_step(trainer)
                synchronize(trainer)
                stepper.step_ended(loss)

        return (StepByStep(),)

    @property
    def model(self) -> Any:
        return self.trainer.model

    def global_batch(self) -> int:
        args = self.trainer.args
        return int(args.per_device_train_batch_size) * int(args.gradient_accumulation_steps) * int(args.world_size)

    def evaluate(self) -> dict[str, float]:
        # the Trainer's evaluation loop runs beside its paused training loop: it keeps no state of its own there
        return {k: float(v) for k, v in self.trainer.evaluate().items() if isinstance(v, (int, float))}

    def facts(self) -> dict[str, Any]:
        return trainer_facts(self.trainer)
