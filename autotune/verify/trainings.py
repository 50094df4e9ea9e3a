"""The gates' short trainings: one per configuration, shared by the checks that read it.

The numerics check compares a candidate's first losses with its fp32 reference's; the
quality check compares evaluate() after an identical short training. Both start from the
same seed, weights and global batches, so one training serves both: the run records the
losses of every step (averaged over ranks) and, where the model file has evaluate(), its
score at the end. A configuration that computes what another already did (they differ only
in placement knobs, ``work_key``) is not trained again: the simplified configuration of the
ablation, a candidate that shares a reference with another.
"""
from __future__ import annotations

import dataclasses
import json

from autotune.config import TrialConfig
from autotune.trials.runner import TrialResult, TrialRunnerLike

# Knobs that only place or feed the work (threads, allocator, pinning, DataLoader
# workers): they change no arithmetic beyond the order of a sum, so two candidates that
# differ only in them share one training.
PLACEMENT_KNOBS = ("threads", "interop_threads", "num_workers", "persistent_workers",
                   "prefetch_factor", "pin_memory", "allocator", "affinity")


def work_key(cfg: TrialConfig) -> str:
    """``cfg`` less its placement knobs: configurations with one key compute the same."""
    return json.dumps({k: v for k, v in cfg.to_dict().items() if k not in PLACEMENT_KNOBS},
                      sort_keys=True)


def training_steps(cfg: TrialConfig, *, evaluate: bool, numerics_steps: int, quality_samples: int) -> int:
    """How long a gate's training of ``cfg`` is: the numerics check's steps, or, where
    evaluate() scores it, the quality check's samples at ``cfg``'s batch size if longer."""
    if not evaluate:
        return numerics_steps
    return max(numerics_steps, -(-quality_samples // cfg.batch_size))


@dataclasses.dataclass
class Trainings:
    """The short trainings of one verification, by ``work_key``. ``evaluate``: whether the
    model file has evaluate(), which then scores every training (the quality check reads it
    where a knob trades quality); each is ``training_steps`` long."""

    runner: TrialRunnerLike
    evaluate: bool
    numerics_steps: int = 40
    quality_samples: int = 6400
    runs: dict[str, TrialResult] = dataclasses.field(default_factory=dict)

    def steps(self, cfg: TrialConfig) -> int:
        return training_steps(cfg, evaluate=self.evaluate, numerics_steps=self.numerics_steps,
                              quality_samples=self.quality_samples)

    def of(self, cfg: TrialConfig, role: str) -> TrialResult:
        """``cfg``'s training (``role`` names its folder: reference or candidate)."""
        key = work_key(cfg)
        if key not in self.runs:
            name = f"verify-gates-{len(self.runs)}-{role}"
            steps = self.steps(cfg)
            self.runs[key] = (self.runner.run(cfg, name=name, quality_steps=steps) if self.evaluate
                              else self.runner.run(cfg, name=name, trajectory_steps=steps))
        return self.runs[key]
