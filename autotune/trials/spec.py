"""What the tuner tells a trial's worker to do (``TrialSpec``): the configuration, where to
report, how to measure and what to do once set up (``TrialMode``). The runner writes it
as the trial's spec.json; the worker reads it back (``python -m autotune.trials.worker
SPEC``), a warm process each next configuration's from its control file.
"""
from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from typing import Any, cast

from autotune.config import KnobValue
from autotune.runtime.json_value import JsonObject
from autotune.runtime.knobs import ConfigDict
from autotune.trials.protocol import Measurement, Mode
from autotune.trials.script_session import ScriptRun


@dataclasses.dataclass(frozen=True)
class LossGuard:
    """Losses a gate's training must stay within ``by`` of, step by step (the fp32
    reference's first losses, with the numerics check's bound): one that strays ends
    there, unscored, since the check rejects it whatever follows."""

    losses: tuple[float, ...]
    by: float

    def strays(self, step: int, loss: float) -> bool:
        return step < len(self.losses) and abs(loss - self.losses[step]) > self.by

    def to_json(self) -> JsonObject:
        return {"losses": list(self.losses), "by": self.by}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LossGuard:
        return cls(tuple(float(v) for v in data["losses"]), float(data["by"]))


@dataclasses.dataclass(frozen=True)
class TrialMode:
    """What a trial does once set up: measure (the default), serve windows on command,
    train ``steps`` steps for their losses (a trajectory) and then a score (quality), or
    profile one window (where the step goes)."""

    mode: Mode = Mode.MEASURE
    steps: int | None = None
    # a quality run's: the steps before which evaluate() also scores the model (0: before
    # any training), besides once after the last
    evaluate_at: tuple[int, ...] = ()
    guard: LossGuard | None = None  # a gate's training: where it ends early

    @classmethod
    def serve(cls) -> TrialMode:
        return cls(Mode.SERVE)

    @classmethod
    def trajectory(cls, steps: int, *, guard: LossGuard | None = None) -> TrialMode:
        return cls(Mode.TRAJECTORY, steps, guard=guard)

    @classmethod
    def quality(cls, steps: int, *, evaluate_at: tuple[int, ...] = (), guard: LossGuard | None = None) -> TrialMode:
        return cls(Mode.QUALITY, steps, tuple(sorted(set(evaluate_at))), guard)

    @classmethod
    def profile(cls) -> TrialMode:
        return cls(Mode.PROFILE)

    def to_json(self) -> JsonObject:
        """The spec's keys for it: none for a measurement, as specs always had."""
        if self.mode is Mode.MEASURE:
            return {}
        return {"mode": self.mode.value, **({"steps": self.steps} if self.steps is not None else {}),
                **({"evaluate_at": list(self.evaluate_at)} if self.evaluate_at else {}),
                **({"guard": self.guard.to_json()} if self.guard is not None else {})}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TrialMode:
        steps = data.get("steps")
        return cls(Mode(data.get("mode", Mode.MEASURE)), int(steps) if steps is not None else None,
                   tuple(int(s) for s in data.get("evaluate_at") or ()),
                   LossGuard.from_json(data["guard"]) if data.get("guard") else None)


@dataclasses.dataclass(frozen=True)
class TrialSpec:
    """One configuration's trial: the model file and configuration to train, the files it
    reports into (``events``) and takes commands from (``control``: a served trial's
    windows), its log, its measurement, seed and mode. ``next``: a warm process's control
    file, where the spec of its next configuration will be named once this one reports.
    ``script``: for a Trainer script (``model_file`` is the script), its arguments and the
    TrainingArguments the configuration overrides."""

    model_file: str
    config: dict[str, KnobValue]  # TrialConfig.to_dict()
    events: str
    control: str | None = None
    log: str | None = None
    measure: Measurement = Measurement()
    seed: int = 0
    mode: TrialMode = TrialMode()
    next: str | None = None
    script: ScriptRun | None = None

    @property
    def knobs(self) -> ConfigDict:
        """The configuration as the runtime reads it."""
        return cast(ConfigDict, self.config)

    def to_json(self) -> JsonObject:
        out: JsonObject = {"model_file": self.model_file, "config": self.config, "events": self.events,
                           "control": self.control, "log": self.log, "measure": self.measure.to_json(),
                           "seed": self.seed, **self.mode.to_json()}
        if self.next is not None:
            out["next"] = self.next
        if self.script is not None:
            out["script"] = self.script.to_json()
        return out

    def write(self, path: str | os.PathLike[str]) -> None:
        with open(path, "w") as f:
            f.write(json.dumps(self.to_json(), indent=1))

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TrialSpec:
        return cls(model_file=str(data["model_file"]), config=data["config"], events=str(data["events"]),
                   control=data.get("control"), log=data.get("log"),
                   measure=Measurement.from_json(data.get("measure", {})), seed=int(data.get("seed", 0)),
                   mode=TrialMode.from_json(data), next=data.get("next") or None,
                   script=ScriptRun.from_json(data["script"]) if data.get("script") else None)

    @classmethod
    def read(cls, path: str) -> TrialSpec:
        with open(path) as f:
            return cls.from_json(json.load(f))
