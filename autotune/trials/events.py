"""The lines of a trial's events.jsonl, one dataclass per ``Event`` kind: the worker builds
one and ``Events.emit`` stamps it (its rank, the wall-clock time) and writes its
``to_json()``; the tuner reads each line back into its type with ``trials.logs.read_event``
(the trial process writes them without pydantic, which reads them).

Every line is ``{"e": kind, "rank": ..., "t": ..., **fields}``, the fields as they were
before these types: tests, tools and older tuners read them by key. Reading is lenient
where a field says nothing the tuner acts on (a stand-in worker's lines carry few),
strict where it does (a window's rate, an error's kind).
"""
from __future__ import annotations

import dataclasses
import enum
from typing import ClassVar, TypeAlias

from autotune.runtime.json_value import JsonObject
from autotune.runtime.process_facts import ProcessFacts
from autotune.runtime.step_profile import StepProfile
from autotune.trials.protocol import Event, Failure, Mode


def _stamp(kind: Event, rank: int, t: float) -> JsonObject:
    return {"e": kind.value, "rank": rank, "t": t}


class _Line:
    """An event whose line is its stamp, then its fields in their order (a vocabulary's
    member as its value)."""

    KIND: ClassVar[Event]
    rank: int
    t: float

    def to_json(self) -> JsonObject:
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)  # type: ignore[arg-type]
                  if f.name not in ("rank", "t")}
        return {**_stamp(self.KIND, self.rank, self.t),
                **{k: v.value if isinstance(v, enum.Enum) else v for k, v in fields.items()}}


@dataclasses.dataclass(frozen=True)
class SetupEvent(_Line):
    """The process group, model and data are ready, ``seconds`` after the configuration
    began, of which ``process_s`` the process's own setup (imports, build_dataset: paid
    once by a warm process, whose later configurations report 0)."""

    KIND: ClassVar[Event] = Event.SETUP
    seconds: float = 0.0
    process_s: float = 0.0
    world: int | None = None
    backend: str | None = None
    pid: int | None = None
    warm: bool = False  # run in a process an earlier configuration started
    process: ProcessFacts | None = None
    rank: int = 0
    t: float = 0.0

    def to_json(self) -> JsonObject:
        # the process's facts among the line's own
        line = super().to_json()
        del line["process"]
        return {**line, **(dataclasses.asdict(self.process) if self.process is not None else {})}


@dataclasses.dataclass(frozen=True)
class BeatEvent(_Line):
    """A warm-up step finished: the hang watch's heartbeat."""

    KIND: ClassVar[Event] = Event.BEAT
    phase: str = "warmup"
    step: int = 0
    rank: int = 0
    t: float = 0.0


@dataclasses.dataclass(frozen=True)
class FactsEvent:
    """What the first step showed (``runtime.facts.step_facts``, the DataLoader's worker
    pids, the utilisation figures): stored with the trial's result (``TrialResult.facts``
    keeps the line) and compared by key, never acted on, so a JSON object."""

    KIND: ClassVar[Event] = Event.FACTS
    facts: JsonObject
    rank: int = 0
    t: float = 0.0

    def to_json(self) -> JsonObject:
        return {**_stamp(self.KIND, self.rank, self.t), **self.facts}


@dataclasses.dataclass(frozen=True)
class WarmupEvent:
    """Warm-up done: the first step's seconds (compile, lazy initialisation) and a steady
    step's; ``steps_per_window`` where the trial measures (not when served)."""

    KIND: ClassVar[Event] = Event.WARMUP
    first_step_s: float
    step_s: float = 0.0
    steps_per_window: int | None = None
    rank: int = 0
    t: float = 0.0

    def to_json(self) -> JsonObject:
        out: JsonObject = {**_stamp(self.KIND, self.rank, self.t), "first_step_s": self.first_step_s,
                           "step_s": self.step_s}
        if self.steps_per_window is not None:
            out["steps_per_window"] = self.steps_per_window
        return out


@dataclasses.dataclass(frozen=True)
class ReadyEvent(_Line):
    """A served trial waits for window commands."""

    KIND: ClassVar[Event] = Event.READY
    rank: int = 0
    t: float = 0.0


@dataclasses.dataclass(frozen=True)
class WindowEvent(_Line):
    """One measured window: its index, throughput, seconds and steps."""

    KIND: ClassVar[Event] = Event.WINDOW
    i: int
    samples_per_s: float
    seconds: float = 0.0
    steps: int = 0
    rank: int = 0
    t: float = 0.0


@dataclasses.dataclass(frozen=True)
class DoneEvent:
    """The result of the trial's mode. A measurement's (``Mode.MEASURE``): the median window
    throughput ``value``, every window's ``values`` and their ``iqr``, the memory held
    (this process's resident peak, the busiest rank's, rank 0's GPU reservation and the
    GPU's size: None off CUDA), page faults per step where counted. A trajectory's: the
    ``losses`` alone (a measurement's are its windows'); a quality run's, with evaluate()'s
    ``metric`` after the last step (None where not scored) and its ``evaluations`` along the
    way, (step, score) before the steps the run was asked to score at. A profiled window's (``Mode.PROFILE``): where its
    step went (``step_profile``, as best_config.json writes one) and its ``samples_per_s``,
    slowed by the profiler: not a measurement. The mode is not on the line: what it
    carries says."""

    KIND: ClassVar[Event] = Event.DONE
    mode: Mode = Mode.MEASURE
    losses: list[float] = dataclasses.field(default_factory=list)
    value: float | None = None
    values: list[float] = dataclasses.field(default_factory=list)
    iqr: float | None = None
    peak_rss_mb: float | None = None
    rank_peak_mb: float | None = None
    cuda_peak_mb: float | None = None
    cuda_total_mb: float | None = None
    minor_faults_per_step: float | None = None
    metric: float | None = None
    evaluations: list[tuple[int, float]] = dataclasses.field(default_factory=list)
    step_profile: StepProfile | None = None
    samples_per_s: float | None = None
    rank: int = 0
    t: float = 0.0

    def to_json(self) -> JsonObject:
        out = _stamp(self.KIND, self.rank, self.t)
        if self.mode is Mode.PROFILE:
            out.update(step_profile=self.step_profile.to_json() if self.step_profile is not None else None,
                       samples_per_s=self.samples_per_s)
        elif self.mode is Mode.MEASURE:
            out.update(value=self.value, values=self.values, iqr=self.iqr, peak_rss_mb=self.peak_rss_mb,
                       rank_peak_mb=self.rank_peak_mb, cuda_peak_mb=self.cuda_peak_mb,
                       cuda_total_mb=self.cuda_total_mb, losses=self.losses)
            if self.minor_faults_per_step is not None:
                out["minor_faults_per_step"] = self.minor_faults_per_step
        else:
            out["losses"] = self.losses
            if self.mode is Mode.QUALITY:
                out["metric"] = self.metric
                if self.evaluations:
                    out["evaluations"] = [[step, score] for step, score in self.evaluations]
        return out


@dataclasses.dataclass(frozen=True)
class ErrorEvent(_Line):
    """The trial failed (every rank reports its own): how (a ``Failure``), its message and
    traceback."""

    KIND: ClassVar[Event] = Event.ERROR
    kind: Failure
    message: str
    traceback: str = ""
    rank: int = 0
    t: float = 0.0


TrialEvent: TypeAlias = (SetupEvent | BeatEvent | FactsEvent | WarmupEvent | ReadyEvent | WindowEvent | DoneEvent
                          | ErrorEvent)

# Each kind's type: what a line's "e" says it is.
EVENT_TYPES: dict[Event, type[TrialEvent]] = {kind.KIND: kind for kind in (
    SetupEvent, BeatEvent, FactsEvent, WarmupEvent, ReadyEvent, WindowEvent, DoneEvent, ErrorEvent)}
