"""A trial of a script the user already runs (a Hugging Face Trainer script or a Lightning
one): their own script and Trainer, stepped by the worker (``runtime.stepper``) as a model
file's ``Session`` is, so that the same measurement, served windows and gate trainings run on
it (``trials.worker``)."""
from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Iterator, Mapping
from typing import Any

from autotune.runtime.json_value import JsonObject
from autotune.runtime.knobs import ConfigDict


@dataclasses.dataclass(frozen=True)
class ScriptRun:
    """What a trial of a script runs: which kind of script (``kind``; for Lightning, the
    package it imports), its arguments, and what its configuration overrides (for a Trainer
    script, TrainingArguments fields; for Lightning, Trainer and DataLoader arguments)."""

    argv: tuple[str, ...] = ()
    overrides: JsonObject = dataclasses.field(default_factory=dict)
    metric: str = "eval_loss"
    greater_is_better: bool = False
    kind: str = "hf_trainer"
    source_module: str = ""

    def to_json(self) -> JsonObject:
        return {"argv": list(self.argv), "overrides": dict(self.overrides), "metric": self.metric,
                "greater_is_better": self.greater_is_better, "kind": self.kind, "source_module": self.source_module}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ScriptRun:
        return cls(argv=tuple(str(a) for a in data.get("argv", ())), overrides=dict(data.get("overrides", {})),
                   metric=str(data.get("metric", "eval_loss")),
                   greater_is_better=bool(data.get("greater_is_better", False)),
                   kind=str(data.get("kind", "hf_trainer")), source_module=str(data.get("source_module", "")))


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
        from autotune.runtime import hf_script
        from autotune.runtime.distributed import Distributed
        from autotune.runtime.session import apply_process_knobs
        from autotune.runtime.stepper import HfStepper, LightningStepper, Stepper

        apply_process_knobs(cfg)  # the threads, as the launcher's environment says
        self.cfg, self.run = cfg, run
        self.dist = Distributed(cfg)
        self.stepper: Stepper
        if run.kind == "lightning":
            self.stepper = LightningStepper(script, run.argv, run.overrides, source_module=run.source_module,
                                            out_dir=out_dir)
        else:
            self.stepper = HfStepper(script, run.argv, {**hf_script.QUIET, "output_dir": out_dir,
                                                        "max_steps": hf_script.ENDLESS_STEPS, **run.overrides})
        self.stepper.start(setup_timeout_s)
        self.global_batch = self.stepper.global_batch()
        self.user = _Evaluation(self)

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
