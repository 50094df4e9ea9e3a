"""The optimizer's step implementation (``optimizer_step``): the user's optimizer rebuilt
of its own class with ``fused=True`` or ``foreach=True``.

What is rebuilt: an optimizer whose class torch.optim defines (Adam, AdamW, SGD,
Adagrad... ``torch.optim.Optimizer`` subclasses from the ``torch.optim`` package) and whose
constructor takes the flag. It is built again from its own ``param_groups`` (each group's
hyperparameters, learning rate included, kept as the user set them) and its ``defaults``,
with the chosen flag True and the other False. A class of the user's own, even a subclass
of a torch.optim one, is left as built: its constructor need not take the flag nor pass it
on. The space searches the knob only where it applies (``autotune.space.conditional``:
the model file's optimizer class, recorded by the contract check, and the device); here
an optimizer it does not apply to is left as built and ``step_facts`` says so, a fact the
trial and train_tuned.py --report both show.

Not under IPEX (``ipex.optimize`` gives the optimizer a fused step of its own) nor with
sharding: FSDP2's parameters are DTensors, whose fused kernels torch 2.11 does not cover
on every device (none on CPU over gloo), and whose default step is already foreach on
CUDA; the configuration takes the default there (``TrialConfig``).

Numerics: a fused or foreach step computes the same update with other rounding (fused
Adam is not bitwise the loop's), so a configuration with it stays ``exact`` and the
numerics check compares its losses with the fp32 reference's (the default step) within
the fp32 tolerance, as it does for a layout of several ranks.
"""
from __future__ import annotations

import inspect
from typing import Any

import torch

from .json_value import JsonObject
from .knobs import ConfigDict, OptimizerStep

FLAGS = (OptimizerStep.FOREACH.value, OptimizerStep.FUSED.value)


def step_applies(cfg: ConfigDict, *, sharded: bool) -> str:
    """The step ``cfg`` asks for where it can apply: the default under IPEX or sharding
    (``TrialConfig`` makes it so; a hand-edited train_tuned.json may not)."""
    if cfg.get("ipex") or sharded:
        return OptimizerStep.DEFAULT.value
    return str(cfg.get("optimizer_step") or OptimizerStep.DEFAULT)


def why_not(optimizer: Any, step: str) -> str | None:
    """Why ``optimizer`` cannot be rebuilt with ``step``; None when it can."""
    cls = type(optimizer)
    if not (isinstance(optimizer, torch.optim.Optimizer) and cls.__module__.startswith("torch.optim")):
        return f"{cls.__module__}.{cls.__qualname__} is not a torch.optim class"
    if step not in inspect.signature(cls.__init__).parameters:
        return f"torch.optim.{cls.__name__} takes no {step} argument"
    return None


def with_step(optimizer: Any, step: str) -> Any:
    """``optimizer`` rebuilt with ``step`` (``foreach`` or ``fused``), or as it is for the
    default step or where the step cannot apply (``why_not``). State it already holds
    goes with it."""
    if step not in FLAGS or why_not(optimizer, step) is not None:
        return optimizer
    cls = type(optimizer)
    accepted = inspect.signature(cls.__init__).parameters
    flags = {flag: flag == step for flag in FLAGS if flag in accepted}
    # Each group carries every hyperparameter (add_param_group fills it from defaults),
    # so each keeps its own; the flags are set in each group as well as in defaults.
    groups = [{**group, **flags} for group in optimizer.param_groups]
    defaults = {k: v for k, v in optimizer.defaults.items() if k in accepted}
    rebuilt = cls(groups, **{**defaults, **flags})
    if optimizer.state:
        rebuilt.load_state_dict(optimizer.state_dict())
    return rebuilt


def optimizer_facts(optimizer: Any, step: str) -> JsonObject:
    """What the step knob did: the optimizer's class, its ``fused`` and ``foreach`` flags
    (None: torch's choice), each group's learning rate, weight decay and size, and why a
    step asked for was not applied."""
    defaults = getattr(optimizer, "defaults", {}) or {}
    groups = getattr(optimizer, "param_groups", []) or []
    return {
        "class": type(optimizer).__name__,
        "fused": defaults.get("fused"),
        "foreach": defaults.get("foreach"),
        "groups": [{"lr": float(g["lr"]) if "lr" in g else None, "weight_decay": g.get("weight_decay"),
                    "params": len(g.get("params", []))} for g in groups],
        "not_applied": why_not(optimizer, step) if step in FLAGS else None,
    }
