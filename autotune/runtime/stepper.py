"""The user's own training, step by step, on command: their script runs in a thread of its
own and its Trainer stops at the end of every optimizer step until ``run_steps`` asks for
more. What the caller does between steps (time them, evaluate) happens while the Trainer
waits. Each way in's runtime module holds its subclass (``hf_script.HfStepper``,
``lightning_script.LightningStepper``, ``loop_script.LoopStepper``); the check and the trials use
them, the emitted ``run_tuned.py`` does not (it runs the script straight through)."""
from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

# Set on an error the script's training raised: the optimizer step it raised on (1 = the first).
FAULT_STEP = "_autotune_script_step"


def fault_step(exc: BaseException) -> int | None:
    """The training step of the user's script that raised ``exc``; None where it was raised
    before the first step (or not by a stepped script)."""
    step = getattr(exc, FAULT_STEP, None)
    return step if isinstance(step, int) else None


class ScriptEnded(Exception):
    """The script returned, or exited (``code``: its exit status), without the training
    autotune waited for."""

    def __init__(self, message: str, code: object = None) -> None:
        super().__init__(message)
        self.code = code


class Stepper:
    """The thread and the hand-over between it and the caller; a subclass installs the
    framework's hooks (which call ``begin`` and ``step_ended``)."""

    train_call = "Trainer.train()"  # what the script calls to train, for the messages
    # its quality is a metric the script prints (``trials.printed``), not an evaluation called between steps
    prints_metric = False

    def __init__(self, script: str, argv: Sequence[str], run_script: Callable[[str, Sequence[str]], None]) -> None:
        self.script = os.path.abspath(script)
        self.losses: list[float] = []
        self.loader: Any = None
        self._cond = threading.Condition()
        self._quota = 0
        self._started = False
        self._ended: BaseException | None = None
        self._call: Callable[[], Any] | None = None
        self._answer: tuple[bool, Any] | None = None
        self._run_script = run_script
        self.thread = threading.Thread(target=self._run, args=(list(argv),), daemon=True, name="user-script")

    def _run(self, argv: list[str]) -> None:
        try:
            self._run_script(self.script, argv)
            error: BaseException = ScriptEnded(self._ended_message())
        except SystemExit as exc:
            error = ScriptEnded(f"{self._ended_message()} (it exited with {exc.code!r})", exc.code)
        except BaseException as exc:
            error = exc
            if self._started:  # the step it raised on, for the message (``fault_step``)
                try:
                    setattr(exc, FAULT_STEP, len(self.losses) + 1)
                except AttributeError:  # an exception that takes no attributes
                    pass
        with self._cond:
            self._ended = error
            self._cond.notify_all()

    def training_over(self) -> None:
        """The framework's training has returned (its ``train()`` or ``fit()``): autotune is
        told, and this thread (the script's) goes no further, so that nothing the script does
        after its training (saving, writing, testing) runs here (``script_end``)."""
        from .script_end import park

        with self._cond:
            self._ended = ScriptEnded(self._ended_message())
            self._cond.notify_all()
        park()

    def ended_elsewhere(self, message: str) -> None:
        """Another rank's training is over (its script printed what ended it): whoever waits for
        this one's steps is told (``ScriptEnded``). This script's thread is left where it is, in
        a collective that rank will never join, and ends with the process."""
        with self._cond:
            if self._ended is None:
                self._ended = ScriptEnded(message)
            self._cond.notify_all()

    def _ended_message(self) -> str:
        name = os.path.basename(self.script)
        if not self._started:
            return f"{name} ended without calling {self.train_call}"
        return f"{name}'s {self.train_call} returned before autotune had measured it"

    # --- the Trainer's side (its thread)
    def begin(self, loader: Any) -> None:
        with self._cond:
            self.loader, self._started = loader, True
            self._cond.notify_all()
            self._wait_for_steps()

    def step_ended(self, loss: float) -> None:
        self.losses.append(loss)
        with self._cond:
            self._quota -= 1
            self._cond.notify_all()
            self._wait_for_steps()

    def _wait_for_steps(self) -> None:
        """Wait (holding the condition) for steps to run, doing what the caller asks to be done
        in this thread meanwhile (``in_script``)."""
        while True:
            self._cond.wait_for(lambda: self._quota > 0 or self._call is not None)
            if self._call is None:
                return
            call, self._call = self._call, None
            try:
                self._answer = (True, call())
            except BaseException as exc:
                self._answer = (False, exc)
            self._cond.notify_all()

    # --- the caller's side
    def start(self, timeout_s: float | None = None) -> None:
        """Run the script up to its Trainer's first step; raises what the script raised."""
        self.thread.start()
        with self._cond:
            self._cond.wait_for(lambda: self._started or self._ended is not None, timeout=timeout_s)
            if not self._started:
                self._raise()

    def _raise(self) -> None:
        raise self._ended or ScriptEnded(self._ended_message())

    def run_steps(self, n: int) -> tuple[float, list[float]]:
        """``n`` optimizer steps of the user's Trainer, then a device synchronize; returns
        (wall seconds, their losses)."""
        first = len(self.losses)
        with self._cond:
            start = time.perf_counter()
            self._quota = n
            self._cond.notify_all()
            self._cond.wait_for(lambda: self._quota == 0 or self._ended is not None)
            elapsed = time.perf_counter() - start
            if self._quota:
                self._raise()
        return elapsed, self.losses[first:]

    def in_script(self, call: Callable[[], Any]) -> Any:
        """``call()`` run in the script's thread while its Trainer waits between steps (where
        the framework expects its own loops to run); its result, or what it raised."""
        with self._cond:
            self._answer, self._call = None, call
            self._cond.notify_all()
            self._cond.wait_for(lambda: self._answer is not None or self._ended is not None)
            answer = self._answer
            if answer is None:
                self._raise()
                raise AssertionError("unreachable")
            done, value = answer
        if not done:
            raise value
        return value

    @classmethod
    def for_trial(cls, script: str, argv: Sequence[str], overrides: Mapping[str, Any], *, source_module: str,
                  out_dir: str) -> Stepper:
        """A trial's stepper of ``script``: its configuration's ``overrides`` (the way in's own
        terms), its outputs in ``out_dir``, nothing saved, reported or evaluated unasked."""
        raise NotImplementedError

    # --- what a session reads of it (the subclasses)
    built: Any  # the framework's record of what the script built (its ``trainer`` among it)

    @property
    def trainer(self) -> Any:
        return self.built.trainer

    @property
    def model(self) -> Any:
        raise NotImplementedError

    def global_batch(self) -> int:
        raise NotImplementedError

    def evaluate(self) -> dict[str, float]:
        raise NotImplementedError

    def facts(self) -> dict[str, Any]:
        raise NotImplementedError
