"""What a trial's measurement came to (``TrialResult``): how it ended, its rates, its phases,
and the small summary stored on the study's trial."""
from __future__ import annotations

import dataclasses
from typing import Any

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
    setup: dict[str, Any] = dataclasses.field(default_factory=dict)
    facts: dict[str, Any] = dataclasses.field(default_factory=dict)
    warmup: dict[str, Any] = dataclasses.field(default_factory=dict)
    done: dict[str, Any] = dataclasses.field(default_factory=dict)
    peak_tree_mb: float = 0.0  # what the trial's process tree held at its peak, each page once
    wall_s: float = 0.0
    window_seconds: list[float] = dataclasses.field(default_factory=list)
    phases: dict[str, float] = dataclasses.field(default_factory=dict)
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    warnings: list[str] = dataclasses.field(default_factory=list)
    log_path: str = ""

    @property
    def one_time_s(self) -> float | None:
        """What this configuration costs once, before its steady steps: its own setup (the
        DataLoader, its first batch, the model) plus the first step's excess over a steady
        step (where compile lands). Not the process's setup (imports, the model file's
        build_dataset): every configuration pays that alike, and a warm process paid it
        before."""
        if not self.setup or not self.warmup:
            return None
        excess = self.warmup["first_step_s"] - self.warmup["step_s"]
        own = self.setup["seconds"] - float(self.setup.get("process_s") or 0.0)
        return max(0.0, own) + max(0.0, excess)

    @property
    def losses(self) -> list[float]:
        return list(self.done.get("losses", []))

    def describe_failure(self) -> str:
        text = Failure.describe(self.failure)
        return f"{text}: {self.message}" if self.message else text

    def summary(self) -> dict[str, Any]:
        """What is stored on the study's trial: small, JSON-able."""
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
            **({"rank_peak_mb": round(float(self.done["rank_peak_mb"]), 1)}
               if self.done.get("rank_peak_mb") is not None else {}),
            "wall_s": round(self.wall_s, 2),
            "phases": self.phases,
            "warm": bool(self.setup.get("warm")),  # run in a process an earlier trial started
            "losses": self.losses[:200],
            "facts": {k: v for k, v in self.facts.items() if k != "layer_widths"},
            "threads_seen": self.setup.get("threads"),
            "world": self.setup.get("world"),
            # On CUDA: rank 0's GPU memory at its peak and the GPU's size, which bound the
            # batch sizes worth trying.
            **{k: self.done[k] for k in ("cuda_peak_mb", "cuda_total_mb")
               if self.done.get(k) is not None},
        }
