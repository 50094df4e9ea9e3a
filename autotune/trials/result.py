"""What a trial's measurement came to (``TrialResult``): how it ended, its rates, its phases,
and the small summary stored on the study's trial."""
from __future__ import annotations

import dataclasses

from autotune.runtime.json_value import JsonObject
from autotune.runtime.step_profile import StepProfile
from autotune.trials.events import DoneEvent, SetupEvent, WarmupEvent
from autotune.trials.failure import SCRIPT_FAULT
from autotune.trials.protocol import Failure, Status


@dataclasses.dataclass
class TrialResult:
    status: Status
    value: float | None = None  # median window throughput, samples/s
    values: list[float] = dataclasses.field(default_factory=list)
    iqr: float | None = None
    failure: Failure | None = None
    message: str = ""
    log_tail: str = ""
    # the worker's events, as they came (None: not reported)
    setup: SetupEvent | None = None
    facts: JsonObject = dataclasses.field(default_factory=dict)  # the FACTS line: stored, never acted on
    warmup: WarmupEvent | None = None
    done: DoneEvent | None = None
    peak_tree_mb: float = 0.0  # what the trial's process tree held at its peak, each page once
    wall_s: float = 0.0
    window_seconds: list[float] = dataclasses.field(default_factory=list)
    phases: dict[str, float] = dataclasses.field(default_factory=dict)
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    warnings: list[str] = dataclasses.field(default_factory=list)
    log_path: str = ""
    # the seconds of imports its process found done, forked from a warm interpreter
    # (``forkserver.ForkServer.ready_s``): what a fresh interpreter, a script the user runs,
    # pays on top of this trial's start (None: it imported them itself)
    preimported_s: float | None = None

    @property
    def one_time_s(self) -> float | None:
        """What this configuration costs once, before its steady steps: its own setup (the
        DataLoader, its first batch, the model) plus the first step's excess over a steady
        step (where compile lands). Not the process's setup (imports, the model file's
        build_dataset): every configuration pays that alike, and a warm process paid it
        before."""
        if self.setup is None or self.warmup is None:
            return None
        excess = self.warmup.first_step_s - self.warmup.step_s
        own = self.setup.seconds - self.setup.process_s
        return max(0.0, own) + max(0.0, excess)

    @property
    def losses(self) -> list[float]:
        return list(self.done.losses) if self.done is not None else []

    @property
    def step_profile(self) -> StepProfile | None:
        """Where a profiled run's step went (``TrialRunner.run(profile=True)``); None for any
        other run, or a profiled one that reported none."""
        return self.done.step_profile if self.done is not None else None

    @property
    def metric(self) -> float | None:
        """evaluate()'s score after a quality run (None: not scored, or no such run)."""
        return self.done.metric if self.done is not None else None

    @property
    def evaluations(self) -> list[tuple[int, float]]:
        """evaluate()'s scores of a quality run as (steps trained, score): those along the
        way, then the last (an empty list: not scored)."""
        if self.done is None or self.done.metric is None:
            return []
        return [*self.done.evaluations, (len(self.done.losses), self.done.metric)]

    def describe_failure(self) -> str:
        if self.failure == Failure.USER_ERROR and self.message.startswith(SCRIPT_FAULT):
            return self.message  # said in the script's words already
        text = Failure.describe(self.failure)
        return f"{text}: {self.message}" if self.message else text

    def summary(self) -> JsonObject:
        """What is stored on the study's trial: small, JSON-able."""
        setup, done = self.setup, self.done
        return {
            "status": self.status,
            "value": self.value,
            "values": self.values,
            "iqr": self.iqr,
            "failure": self.failure,
            "message": self.message[:1000],
            "log_tail": self.log_tail[-3000:],
            "one_time_s": self.one_time_s,
            # the tree's peak (proctree.tree_memory), under the key studies already store
            "peak_rss_mb": round(self.peak_tree_mb, 1),
            # the rank that held the most (host memory on CPU, device memory on CUDA):
            # what --memory-limit bounds
            **({"rank_peak_mb": round(done.rank_peak_mb, 1)}
               if done is not None and done.rank_peak_mb is not None else {}),
            "wall_s": round(self.wall_s, 2),
            "phases": self.phases,
            "warm": setup is not None and setup.warm,  # run in a process an earlier trial started
            **({"preimported_s": self.preimported_s} if self.preimported_s is not None else {}),
            "losses": self.losses[:200],
            "facts": {k: v for k, v in self.facts.items() if k != "layer_widths"},
            "threads_seen": setup.process.threads if setup is not None and setup.process is not None else None,
            "world": setup.world if setup is not None else None,
            # On CUDA: rank 0's GPU memory at its peak and the GPU's size, which bound the
            # batch sizes worth trying.
            **({"cuda_peak_mb": done.cuda_peak_mb} if done is not None and done.cuda_peak_mb is not None else {}),
            **({"cuda_total_mb": done.cuda_total_mb}
               if done is not None and done.cuda_total_mb is not None else {}),
            # a profiled run's: where its step went
            **({"step_profile": self.step_profile.to_json()} if self.step_profile is not None else {}),
        }
