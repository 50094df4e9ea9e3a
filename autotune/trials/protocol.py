"""The trial protocol: what the tuner and a trial's worker processes say to each other.

The tuner writes a spec (``autotune.trials.spec.TrialSpec``: the configuration, the mode, how
to measure) into the trial's folder; the worker (``autotune.trials.worker``) appends one JSON
line per ``Event`` (``autotune.trials.events``) to the trial's event file, and the tuner
(``autotune.trials.runner``) reads them. A trial that
fails ends with a ``Failure``; a trial of the search carries a ``Role``. Each vocabulary
is defined once here, as enums that are also strings (they are stored as JSON in the
events, the study and best_config.json). ``ProgressEvent`` names what the search and the
verification tell whoever shows progress (``autotune.report.console.Reporter``); ``StudyAttr``
names the attributes stored on the Optuna study and its trials.
"""
from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from typing import Any

from autotune.options import RunOptions
from autotune.runtime.json_value import JsonObject


class Event(str, enum.Enum):
    """The ``"e"`` field of a line in a trial's events.jsonl."""

    SETUP = "setup"      # the process group, model and data are ready: seconds, world, pid
    BEAT = "beat"        # a warm-up step finished (the hang watch's heartbeat)
    FACTS = "facts"      # what the first step showed: threads, DataLoader workers
    WARMUP = "warmup"    # warm-up done: first_step_s, step_s, steps_per_window (not when served)
    READY = "ready"      # a served trial waits for window commands
    WINDOW = "window"    # one measured window: i, samples_per_s, seconds, steps
    DONE = "done"        # the result of the mode: value/values/losses/metric/step_profile
    ERROR = "error"      # the trial failed: kind (a Failure), message, traceback

    def __str__(self) -> str:
        return self.value


class Command(str, enum.Enum):
    """A line the tuner appends to a served trial's control file."""

    WARM = "warm"      # on a GPU: warm up now (no other process's first steps run meanwhile)
    WINDOW = "window"  # measure one window now

    def __str__(self) -> str:
        return self.value


# Events that show a trial is alive and making progress.
PROGRESS_EVENTS = frozenset({Event.BEAT, Event.WINDOW, Event.WARMUP, Event.FACTS, Event.READY})


class Mode(str, enum.Enum):
    """What a trial does once set up."""

    MEASURE = "measure"        # warm up, then Measurement.windows windows
    SERVE = "serve"            # warm up, then one window per command (verification)
    TRAJECTORY = "trajectory"  # the losses of a fixed number of steps (numerics check)
    QUALITY = "quality"        # a trajectory, then evaluate(): both gates from one training
    PROFILE = "profile"        # warm up, then one window under torch.profiler: where the step goes

    def __str__(self) -> str:
        return self.value


class Failure(str, enum.Enum):
    """How a trial failed, as shown to the user and stored on the Optuna trial."""

    OUT_OF_MEMORY = "out_of_memory"
    TIMEOUT = "timeout"
    HANG = "hang"
    CRASH = "crash"
    COMPILE_ERROR = "compile_error"
    NAN_LOSS = "nan_loss"
    USER_ERROR = "user_error"
    ERROR = "error"
    INTERRUPTED = "interrupted"  # the user stopped the run: the trial is retried, not counted

    def __str__(self) -> str:
        return self.value

    @property
    def help(self) -> str:
        return _FAILURE_HELP[self]

    @classmethod
    def describe(cls, kind: str | None) -> str:
        """The help text of a failure kind, or the kind itself when it is not one of ours."""
        try:
            return cls(kind).help
        except ValueError:
            return kind or "failed"


_FAILURE_HELP = {
    Failure.OUT_OF_MEMORY: "ran out of memory",
    Failure.TIMEOUT: "did not finish within the trial timeout",
    Failure.HANG: "stopped making progress (no step finished within the hang timeout)",
    Failure.CRASH: "the trial process died",
    Failure.COMPILE_ERROR: "torch.compile failed",
    Failure.NAN_LOSS: "the loss became NaN or infinite",
    Failure.USER_ERROR: "the model file raised an error",
    Failure.ERROR: "the trial raised an error",
    Failure.INTERRUPTED: "interrupted by the user; run again to retry it",
}


class Status(str, enum.Enum):
    """How a trial ended."""

    OK = "ok"
    PRUNED = "pruned"
    FAILED = "failed"

    def __str__(self) -> str:
        return self.value


class Role(str, enum.Enum):
    """Why the search ran a trial (stored as the Optuna trial's ``StudyAttr.ROLE``)."""

    BASELINE = "baseline"    # the user's own configuration: what everything is compared with
    HEURISTIC = "heuristic"  # a start point from the machine's shape
    PRECISION = "precision"  # the best configuration with reduced precision
    BATCH = "batch"          # the best configuration at neighbouring batch sizes
    LATE = "late"            # the best configuration with the late knobs (torch.compile)
    MEMORY = "memory"        # a configuration that ran out of memory, holding less (search.memory)
    EDGE = "edge"            # the best one value beyond the edge of an ordered knob's values tried (search.climb)
    STEERED = "steered"      # what the leader's step profile says to try (search.steer)

    def __str__(self) -> str:
        return self.value


class ProgressEvent(str, enum.Enum):
    """The first argument of a ``Progress`` callback (``autotune.trials.progress``); the
    dataclass beside it carries the rest."""

    # the search (autotune.search.tuner)
    START = "start"    # a trial starts: TrialStart
    WINDOW = "window"  # a trial measured one window: TrialWindow
    END = "end"        # a trial ended: TrialEnd
    STALE = "stale"    # a trial left running by an interrupted run was marked failed: StaleTrial
    BUDGET = "budget"  # the search stopped before its trial count: BudgetStop
    # the verification (autotune.verify.gates, autotune.verify.ablation)
    STEP = "step"      # a stage of the verification begins or ends: VerifyStep
    SPEED = "speed"    # a round of the paired speed measurement: SpeedRound

    def __str__(self) -> str:
        return self.value


class StudyAttr(str, enum.Enum):
    """The names of the user attributes autotune stores on the Optuna study and its trials.

    The values are what studies already on disk hold: changing one makes them unreadable."""

    # on a trial
    ROLE = "role"                  # a Role; absent on a sampled trial
    CONFIG = "config"              # the TrialConfig measured, as a dict
    RESULT = "result"              # TrialResult.summary()
    FAILURE = "failure"            # a Failure, when the trial failed
    DUPLICATE_OF = "duplicate_of"  # the number of the earlier trial of the same configuration
    SKIPPED = "skipped"            # why the trial was not run (a message)
    RETRY = "retry"                # the trial measures again an interrupted or stale one
    BASELINE_CONFIG = "baseline_config"  # a baseline trial's: the user's configuration holding less
    # on the study
    STALE = "stale"                    # numbers of trials an interrupted run left running
    STALE_TRIAL = "stale_trial"        # "stale_trial:N": trial N's worker died (a shared study)
    IDENTITY = "identity"              # what a shared study was created for (search.shared)
    STARTED_AT = "started_at"          # when a shared study's first worker began (epoch s)
    PUBLISHED = "published"            # a shared study's verified result, for every worker
    BATCH_ENQUEUED = "batch_enqueued"  # the refinement's trials (batch sizes, edges): how many; True in older studies
    LATE_ENQUEUED = "late_enqueued"    # the late knobs on the best were queued
    PLAN = "plan"                      # the planned run its values rank for (task.objective)
    SPACE = "space"                    # the values searched per knob (search.study.settle_space)
    BATCH_RAMP = "batch_ramp"          # what set the batch range (search.batch_range.Ramp)
    STEERING = "steering"              # the leaders profiled and what each profile queued (search.steering)
    STEER = "steer"                    # on a steered trial: its category, share and why (search.steer.Steer)

    def __str__(self) -> str:
        return self.value


@dataclasses.dataclass(frozen=True)
class Measurement:
    """How a trial measures: ``warmup_steps`` (at least 2: the first carries compilation
    and lazy initialisation), then ``windows`` windows of about ``window_s`` seconds, at
    most ``max_window_steps`` steps each."""

    warmup_steps: int = 3
    window_s: float = RunOptions.window_s
    windows: int = RunOptions.windows
    max_window_steps: int = 10_000

    def to_json(self) -> JsonObject:
        return {"warmup_steps": self.warmup_steps, "window_s": self.window_s, "windows": self.windows,
                "max_window_steps": self.max_window_steps}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Measurement:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown measurement settings: {', '.join(sorted(unknown))}")
        return cls(**data)
