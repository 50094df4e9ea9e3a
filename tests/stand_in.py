"""What the stand-in trial runners share (tests/test_machine_matrix.py's StandInRunner, the
simulated GPU node): they measure nothing. A configuration runs at ``throughput(cfg)``;
its losses track fp32's or, with ``diverge``, reduced precision grows from the first step,
and evaluate() falls with it."""
from __future__ import annotations

from typing import Any

from autotune.config import TrialConfig
from autotune.trials.runner import TrialResult


class StandIn:
    diverge: bool = False

    def __init__(self) -> None:
        self.gated: list[TrialConfig] = []  # configurations the numerics check ran
        self.measured: list[TrialConfig] = []  # configurations the search measured

    def throughput(self, cfg: TrialConfig) -> float:
        raise NotImplementedError

    def threads_seen(self, cfg: TrialConfig) -> int:
        """What a trial reports as its threads (torch's default where cfg leaves them)."""
        return cfg.threads or 1

    def measured_done(self, cfg: TrialConfig) -> dict[str, Any]:
        """What a measured trial reports at its end, beside its windows."""
        return {}

    def losses(self, cfg: TrialConfig, steps: int) -> list[float]:
        if self.diverge and not cfg.exact:
            return [2.3 * 1.03 ** i for i in range(steps)]
        wobble = 0.0 if cfg.exact else 0.01
        return [2.3 * 0.97 ** i * (1 + wobble * (-1) ** i) for i in range(steps)]

    def result(self, cfg: TrialConfig, *, on_window: Any = None, trajectory_steps: int | None = None,
               quality_steps: int | None = None) -> TrialResult:
        """A trial of ``cfg`` in the mode the arguments ask: a loss trajectory, a quality
        run, or three measured windows (reported to ``on_window``, which may prune)."""
        if trajectory_steps is not None:
            self.gated.append(cfg)
            return TrialResult(status="ok", done={"losses": self.losses(cfg, trajectory_steps)})
        if quality_steps is not None:
            metric = 0.5 if self.diverge and not cfg.exact else 0.9
            return TrialResult(status="ok", done={"metric": metric, "losses": [1.0]})
        self.measured.append(cfg)
        value = self.throughput(cfg)
        for i in range(3):
            if on_window is not None and on_window(i, value):
                return TrialResult(status="pruned")
        return TrialResult(status="ok", value=value, values=[value] * 3, iqr=0.0,
                           setup={"threads": self.threads_seen(cfg)}, done=self.measured_done(cfg))
