"""The optimizer's step implementation (``optimizer_step``) for the user's own stack: no
tool's configuration can rebuild the optimizer the user's code builds, so each file names
the change as an instruction (train_tuned.py makes it itself: runtime.optimizer_step)."""
from __future__ import annotations

from autotune.config import TrialConfig
from autotune.runtime.knobs import OptimizerStep


def step_line(cfg: TrialConfig) -> str | None:
    """What ``cfg``'s step asks of the user's optimizer; None for the default step."""
    if cfg.optimizer_step == OptimizerStep.DEFAULT:
        return None
    other = OptimizerStep.FOREACH if cfg.optimizer_step == OptimizerStep.FUSED else OptimizerStep.FUSED
    return (f"optimizer step ({cfg.optimizer_step}): build your torch.optim optimizer with "
            f"{cfg.optimizer_step}=True ({other}=False), e.g. torch.optim.AdamW(model.parameters(), lr=..., "
            f"{cfg.optimizer_step}=True); train_tuned.py rebuilds the one build_optimizer() returns")


def step_code(cfg: TrialConfig) -> list[str]:
    """The loop snippet's line for ``cfg``'s step; none for the default step."""
    if cfg.optimizer_step == OptimizerStep.DEFAULT:
        return []
    return [f"optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, {cfg.optimizer_step}=True)"
            f"  # your optimizer's class and hyperparameters, with {cfg.optimizer_step}=True"]
