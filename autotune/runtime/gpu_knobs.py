"""The GPU knobs beyond precision and compile: the CUDA allocator's expandable segments,
float8 training through torchao, and DistributedDataParallel's bucket view and static graph.

Stdlib only at import (``autotune.trials.launch`` reads the allocator's setting from here
without torch); torch and torchao are imported where a knob is applied.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypedDict

from .knobs import ConfigDict, Device

if TYPE_CHECKING:
    import torch

# The CUDA caching allocator reads its options from this variable once, when CUDA starts:
# a process knob, set in the environment the process starts with.
ALLOC_CONF = "PYTORCH_CUDA_ALLOC_CONF"
EXPANDABLE = "expandable_segments:True"
# float8 matrix products need both dims of a weight divisible by 16 (torchao's kernels).
FLOAT8_ALIGN = 16


def merged_alloc_conf(current: str | None) -> tuple[str, str | None]:
    """The allocator options with expandable segments on, from the ones already set
    (``current``, the user's ``PYTORCH_CUDA_ALLOC_CONF``): theirs are kept, ours appended;
    where they set expandable_segments themselves, their choice stands. Returns the value and
    a warning when theirs was there (None when nothing was set)."""
    if not current:
        return EXPANDABLE, None
    options = [o.strip() for o in current.split(",") if o.strip()]
    if any(o.split(":", 1)[0].strip() == "expandable_segments" for o in options):
        return current, (f"{ALLOC_CONF} is set to {current!r} in your environment and names "
                         "expandable_segments: your setting is kept")
    merged = ",".join([*options, EXPANDABLE])
    return merged, (f"{ALLOC_CONF} is set to {current!r} in your environment: your options are kept "
                    f"and {EXPANDABLE} is added ({merged!r})")


def set_expandable_segments(cfg: ConfigDict, env: Any = None) -> None:
    """Expandable segments in this process's environment, where the configuration has them
    and the launcher did not set them (train_tuned.py started by hand): CUDA reads the
    variable when it starts, after this (the caller runs before any CUDA work)."""
    if not cfg.get("expandable_segments"):
        return
    env = os.environ if env is None else env
    env[ALLOC_CONF] = merged_alloc_conf(env.get(ALLOC_CONF))[0]


class DdpOptions(TypedDict, total=False):
    """DistributedDataParallel's keyword arguments the DDP knobs set (absent: torch's default)."""

    gradient_as_bucket_view: bool
    static_graph: bool


def ddp_options(cfg: ConfigDict) -> DdpOptions:
    """DistributedDataParallel's keyword arguments for the configuration's DDP knobs:
    gradients as views into the communication buckets (no copy into them, and one
    gradient-sized buffer less) and a static graph (the used parameters and hook order
    recorded once, the per-step search for unused parameters skipped)."""
    out: DdpOptions = {}
    if cfg.get("ddp_bucket_view"):
        out["gradient_as_bucket_view"] = True
    if cfg.get("ddp_static_graph"):
        out["static_graph"] = True
    return out


def float8_linears(model: torch.nn.Module) -> list[str]:
    """The names of the Linear layers float8 takes: both dims divisible by 16, and neither
    the first nor the last Linear of the model (torchao recommends keeping the input and
    output layers in high precision: they are the most sensitive to the loss of range)."""
    import torch

    linears = [name for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    edges = {linears[0], linears[-1]} if linears else set()
    modules = dict(model.named_modules())
    return [name for name in linears if name not in edges
            and modules[name].in_features % FLOAT8_ALIGN == 0
            and modules[name].out_features % FLOAT8_ALIGN == 0]


def convert_to_float8(model: torch.nn.Module) -> list[str]:
    """torchao's float8 training (dynamic tensorwise scaling) on ``float8_linears(model)``,
    in place; returns their names. Call it on the model on its device, before DDP and
    compile wrap it (torchao's order: its float8 matmuls are fused by torch.compile)."""
    from torchao.float8 import convert_to_float8_training

    chosen = set(float8_linears(model))
    convert_to_float8_training(model, module_filter_fn=lambda module, fqn: fqn in chosen)
    return sorted(chosen)


def float8_layers(model: torch.nn.Module) -> list[str]:
    """The layers of ``model`` that run float8 matmuls (torchao's Float8Linear), for the facts."""
    return [name for name, m in model.named_modules() if type(m).__name__ == "Float8Linear"]


def ddp_facts(model: Any) -> Mapping[str, Any]:
    """What the DDP knobs did to a DistributedDataParallel ``model`` (None where it is not one)."""
    return {"ddp_bucket_view": getattr(model, "gradient_as_bucket_view", None),
            "ddp_static_graph": getattr(model, "static_graph", None)}


def expandable_in_use(device: torch.device) -> bool | None:
    """Whether the CUDA caching allocator maps its memory as expandable segments (the
    segments of its snapshot say so); None off CUDA, or before it holds any memory."""
    if device.type != Device.CUDA:
        return None
    import torch

    segments = torch.cuda.memory_snapshot()
    return any(bool(s.get("is_expandable")) for s in segments) if segments else None
