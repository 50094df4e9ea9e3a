"""The GPU knobs (``autotune.runtime.gpu_knobs``) in the stack files of ``emit.stacks``:
DDP's options as each tool takes them (Lightning's DDPStrategy keywords, Accelerate's
DistributedDataParallelKwargs, the loop snippet's DistributedDataParallel call), float8's
conversion where no tool does it, and the allocator's options before Python starts.
Expandable segments travel in the environment that every stack file already carries.
"""
from __future__ import annotations

import enum
import shlex
from collections.abc import Mapping

from autotune.config import TrialConfig
from autotune.runtime import gpu_knobs
from autotune.runtime.json_value import JsonObject

FLOAT8_CODE = ("from torchao.float8 import convert_to_float8_training  # pip install torchao",
               "convert_to_float8_training(model, module_filter_fn=lambda m, fqn: fqn in FLOAT8_LAYERS)")


def ddp_kwargs(cfg: TrialConfig) -> JsonObject:
    """DistributedDataParallel's keyword arguments for the tuned DDP knobs (none when off)."""
    options = gpu_knobs.ddp_options({"ddp_bucket_view": cfg.ddp_bucket_view, "ddp_static_graph": cfg.ddp_static_graph})
    return {name: bool(value) for name, value in options.items()}


def _kwargs_text(kwargs: Mapping[str, object]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in kwargs.items())


def ddp_call(cfg: TrialConfig, device_ids: str) -> str:
    """The snippet's DistributedDataParallel(...) call, with the tuned options."""
    kwargs = ddp_kwargs(cfg)
    args = ["model", *([device_ids] if device_ids else []), *([_kwargs_text(kwargs)] if kwargs else [])]
    return f"model = torch.nn.parallel.DistributedDataParallel({', '.join(args)})"


def float8_note() -> str:
    return ("FLOAT8_LAYERS: the Linear layers of your model with both dims divisible by 16, less the first "
            "and the last (train_tuned.py picks them: tuned_runtime/gpu_knobs.py float8_linears); on the "
            "model on its GPU, before DDP and torch.compile wrap it")


class Tool(str, enum.Enum):
    """The tool a stack file is written for (a model file's answer in another tool's words)."""

    ACCELERATE = "accelerate"
    LIGHTNING = "lightning"
    TORCHRUN = "torchrun"


def not_expressible(cfg: TrialConfig, *, tool: Tool) -> list[str]:
    """The GPU knobs a tool's configuration cannot hold (Lightning holds DDP's options in
    its strategy, ``emit.lightning_trainer._lightning_strategy``)."""
    out = []
    if cfg.float8:
        out.append(f"float8 training (torchao): {'; '.join(FLOAT8_CODE)}; {float8_note()}")
    kwargs = ddp_kwargs(cfg)
    if kwargs and tool == Tool.ACCELERATE:
        handler = f"DistributedDataParallelKwargs({_kwargs_text(kwargs)})"
        out.append("DDP options: from accelerate.utils import DistributedDataParallelKwargs; "
                   f"accelerator = Accelerator(kwargs_handlers=[{handler}])")
    elif kwargs and tool != Tool.LIGHTNING:
        out.append(f"DDP options: DistributedDataParallel(model, ..., {_kwargs_text(kwargs)})")
    return out


def model_code(cfg: TrialConfig, baseline: TrialConfig, *, becomes_ddp: bool) -> list[str]:
    """The loop snippet's lines for the model: float8's conversion (where the model is on its
    GPU, before DDP and compile), and DDP's options where the user's script has DDP already
    (a script that becomes DDP gets them in its call, ``ddp_call``)."""
    code = []
    if cfg.float8 and not baseline.float8:
        code += [*FLOAT8_CODE, f"# {float8_note()}"]
    if ddp_kwargs(cfg) and not becomes_ddp and ddp_kwargs(cfg) != ddp_kwargs(baseline):
        code.append(f"# your DistributedDataParallel(model, ...) with {_kwargs_text(ddp_kwargs(cfg))}")
    return code


def snippet_shell(cfg: TrialConfig, baseline: TrialConfig, env: Mapping[str, str]) -> list[str]:
    """The loop snippet's shell lines: the allocator's options, added to yours."""
    if not cfg.expandable_segments or baseline.expandable_segments or gpu_knobs.ALLOC_CONF not in env:
        return []
    return [f"export {gpu_knobs.ALLOC_CONF}={shlex.quote(env[gpu_knobs.ALLOC_CONF])}  # before CUDA starts; "
            "keep your own options in it"]
