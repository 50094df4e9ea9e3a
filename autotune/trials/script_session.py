"""A trial of a script the user already runs (a plain training loop, a Hugging Face Trainer
script, a Lightning one): their own script, held step by step by its way in's stepper
(``runtime.stepper``) and spoken to as a model file's ``Session`` is (``trials.training``), so
that the same measurement, served windows and gate trainings run on it (``trials.worker``)."""
from __future__ import annotations

import contextlib
import dataclasses
import importlib
import math
import os
from collections.abc import Iterator, Mapping
from typing import Any

from autotune.runtime.json_value import JsonObject
from autotune.runtime.knobs import ConfigDict
from autotune.trials.printed import PrintedScores


@dataclasses.dataclass(frozen=True)
class ScriptRun:
    """What a trial of a script runs: its Stepper (``module:Class``, the way in's; the package
    it trains with), its arguments, and what its configuration changes (the way in's own
    terms: a Trainer script's TrainingArguments fields, a Lightning script's Trainer and
    DataLoader arguments, a plain loop's edits of its source)."""

    argv: tuple[str, ...] = ()
    overrides: JsonObject = dataclasses.field(default_factory=dict)
    metric: str = "eval_loss"
    greater_is_better: bool = False
    stepper: str = ""
    source_module: str = ""

    def to_json(self) -> JsonObject:
        return {"argv": list(self.argv), "overrides": dict(self.overrides), "metric": self.metric,
                "greater_is_better": self.greater_is_better, "stepper": self.stepper,
                "source_module": self.source_module}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ScriptRun:
        return cls(argv=tuple(str(a) for a in data.get("argv", ())), overrides=dict(data.get("overrides", {})),
                   metric=str(data.get("metric", "eval_loss")),
                   greater_is_better=bool(data.get("greater_is_better", False)),
                   stepper=str(data.get("stepper", "")), source_module=str(data.get("source_module", "")))


class _Evaluation:
    """What the quality gate calls as a model file's ``evaluate(model)``: the Trainer's own
    evaluation (``evaluate()``, or Lightning's validation loop), its metric turned so that
    higher is better."""

    def __init__(self, session: ScriptSession) -> None:
        self.session = session

    def evaluate(self, model: Any) -> float:
        run = self.session.run
        metrics = self.session.stepper.evaluate()
        if run.metric not in metrics:
            raise ValueError(f"the script's evaluation logged no {run.metric!r} (it logged {sorted(metrics)})")
        value = float(metrics[run.metric])
        if not math.isfinite(value):
            return value
        return value if run.greater_is_better else -value


class ScriptSession:
    """One configuration of the user's Trainer script in this process (its ``Stepper``), with
    what the worker reads of a ``Session``: the rank (``dist``: one), its DataLoader, the global
    batch, steps on command."""

    def __init__(self, script: str, cfg: ConfigDict, run: ScriptRun, *, out_dir: str,
                 setup_timeout_s: float | None = None) -> None:
        from autotune.runtime.distributed import Distributed
        from autotune.runtime.session import apply_process_knobs
        from autotune.runtime.stepper import Stepper

        apply_process_knobs(cfg)  # the threads, as the launcher's environment says
        self.cfg, self.run = cfg, run
        self.folder = os.path.dirname(out_dir)  # the trial's: what a scored loop may write in
        self.dist = Distributed(cfg)
        module, _, name = run.stepper.partition(":")
        stepper_class = getattr(importlib.import_module(module), name)
        assert issubclass(stepper_class, Stepper), run.stepper
        self.stepper = stepper_class.for_trial(script, run.argv, run.overrides, source_module=run.source_module,
                                               out_dir=out_dir)
        # a plain loop's metric, read from what it prints from its first line on (``--metric``)
        self.printed: PrintedScores | None = None
        if stepper_class.prints_metric and run.metric:
            self.printed = PrintedScores(run.metric, greater_is_better=run.greater_is_better, stepper=self.stepper)
            self.printed.install()
        self.stepper.start(setup_timeout_s)
        self.user = _Evaluation(self)

    @property
    def global_batch(self) -> int:
        """The samples a step takes, as the script's training says (read again: a plain loop
        knows its step's micro-batches once a step has ended)."""
        return self.stepper.global_batch()

    @property
    def loader(self) -> Any:
        return self.stepper.loader

    def run_steps(self, n: int) -> tuple[float, list[float]]:
        return self.stepper.run_steps(n)

    def step(self) -> Any:
        import torch

        _, losses = self.stepper.run_steps(1)
        return torch.tensor(losses[-1])

    @contextlib.contextmanager
    def evaluation_model(self) -> Iterator[Any]:
        yield self.stepper.model

    def facts(self) -> JsonObject:
        return self.stepper.facts()

    def release(self) -> None:
        """A script's process trains one configuration: nothing to hand on."""

    def close(self) -> None:
        self.dist.close()
