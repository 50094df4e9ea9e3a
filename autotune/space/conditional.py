"""Knobs that apply only where another knob or the model file allows them: the DataLoader's
``prefetch_factor`` (with workers) and the optimizer's step implementation
(``optimizer_step``: the model file's optimizer class, the device, not under IPEX).

Their builders for ``autotune.space.build_space``, and the count of configurations the
space holds with them: a configuration where a knob does not apply takes its default
(``TrialConfig``), so its other values add no configuration there.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from autotune.config import KnobValue, TrialConfig
from autotune.runtime.knobs import Device, OptimizerStep

# What a builder decides, as autotune.space.choices.KnobChoice holds it: the values to search
# (none: the knob is not searched) and "knob[=value]" -> why each value is left out.
Choice = tuple[list[Any], dict[str, str]]

# Batches each DataLoader worker loads ahead: None is torch's default (2).
PREFETCH_FACTORS: list[int | None] = [None, 4, 8]

# The torch.optim classes whose step torch fuses, per device, in torch 2.4 and later (the
# fused CPU kernels arrived in 2.4). Adagrad's fused kernel is CPU-only: torch 2.11+cu130
# refuses fused=True for CUDA parameters at its first step (seen on an H100, where fused
# Adam, AdamW and SGD stepped on both devices); torch 2.13 no longer checks, but the
# torch a GPU machine runs may, so Adagrad is not searched on CUDA.
FUSED_CLASSES: dict[str, tuple[str, ...]] = {
    Device.CPU: ("Adam", "AdamW", "SGD", "Adagrad"),
    Device.CUDA: ("Adam", "AdamW", "SGD"),
}
# The torch.optim classes with a foreach step (every one with a for-loop over the tensors).
FOREACH_CLASSES = ("Adadelta", "Adafactor", "Adagrad", "Adam", "Adamax", "AdamW", "ASGD", "NAdam",
                   "RAdam", "RMSprop", "Rprop", "SGD")

# knob -> (the knob it depends on, whether a value of that one lets it apply)
CONDITIONS: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "prefetch_factor": ("num_workers", lambda workers: bool(workers)),
    "optimizer_step": ("ipex", lambda ipex: not ipex),
}


def torch_optim_class(optimizer: str) -> str | None:
    """The class name of ``optimizer`` (``module.qualname``, Task.optimizer) when torch.optim
    defines it; None for any other class (the user's own, or a library's)."""
    module, _, name = optimizer.rpartition(".")
    return name if module == "torch.optim" or module.startswith("torch.optim.") else None


def optimizer_step_choice(device: str, optimizer: str, *, torch: str | None) -> Choice:
    """The optimizer's step (``torch``: torch's version): [default, fused] where torch fuses the class on ``device``; on
    CPU [default, foreach] for a class with only a foreach step (on CUDA torch already
    takes foreach by default, so it would measure the default twice); excluded, named,
    for a class torch.optim does not define (its constructor need not take the flags)."""
    name = torch_optim_class(optimizer)
    if name is None:
        return ([], {"optimizer_step": f"the model file's optimizer {optimizer} is not a torch.optim "
                                                 "class: autotune cannot rebuild it with fused=True"})
    if name in FUSED_CLASSES.get(device, ()):
        if device == Device.CPU and _older_than(torch, (2, 4)):
            return ([], {"optimizer_step": f"torch {torch} has no fused {name} step on CPU "
                                                     "(torch 2.4 added it)"})
        return ([OptimizerStep.DEFAULT.value, OptimizerStep.FUSED.value],
                          {"optimizer_step=foreach": "the fused step does the same work in fewer kernels"})
    if device == Device.CPU and name in FOREACH_CLASSES:
        return ([OptimizerStep.DEFAULT.value, OptimizerStep.FOREACH.value],
                          {"optimizer_step=fused": f"torch has no fused {name} step on CPU"})
    why = (f"torch has no fused {name} step on {device}" if name in FOREACH_CLASSES
           else f"torch.optim.{name} has neither a fused nor a foreach step")
    if device == Device.CUDA and name in FOREACH_CLASSES:
        why += " and takes foreach there by default"
    return ([], {"optimizer_step": why})


def prefetch_factor_choice(workers: Sequence[int], pinned: int | None = None) -> Choice:
    """Batches loaded ahead per worker, searched where some configuration has workers
    (``workers``, or the ``pinned`` count): on those without, the knob takes its default
    (TrialConfig)."""
    workers = workers if pinned is None else [pinned]
    if not any(workers):
        return ([], {"prefetch_factor": "no DataLoader workers to prefetch with"})
    return list(PREFETCH_FACTORS), {}


def conditional_count(choices: Mapping[str, Sequence[Any]], fixed: Mapping[str, KnobValue],
                      baseline: TrialConfig) -> tuple[int, frozenset[str]]:
    """How many configurations the conditional knobs and the knobs they depend on make
    together (each value of a knob it depends on times the conditional knob's values
    where it applies there, else one), and those knobs' names, which the caller leaves
    out of its own product."""
    count, names = 1, set()
    for knob, (parent, applies) in CONDITIONS.items():
        if knob not in choices:
            continue
        names |= {knob, parent}
        parents = choices.get(parent) or [fixed.get(parent, getattr(baseline, parent))]
        count *= sum(len(choices[knob]) if applies(v) else 1 for v in parents)
    # a knob both depend on would be counted twice (none is today)
    return count, frozenset(names)


def _older_than(version: str | None, than: tuple[int, int]) -> bool:
    """Whether torch ``version`` ("2.3.1+cpu") is older than ``than``; unknown: not older."""
    try:
        major, minor = (int(part) for part in (version or "").split("+")[0].split(".")[:2])
    except ValueError:
        return False
    return (major, minor) < than
