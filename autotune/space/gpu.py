"""The search space of the GPU knobs of ``autotune.runtime.gpu_knobs``: expandable
segments, float8 training and DDP's bucket view and static graph. Where each is searched,
why not elsewhere, and the configurations where one of them cannot act (float8 outside
compiled bf16, the DDP knobs without DDP), normalised to the knob off so that the sampler's
choice never makes a configuration that fails or repeats another under another name.
"""
from __future__ import annotations

import functools
import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from autotune.config import KnobValue
from autotune.probes.gpu import GpuInfo
from autotune.runtime.knobs import CompileMode, Device, Precision, Sharding

# Searched on CUDA only, each a bool: off (the baseline's) first.
GPU_KNOBS = ("expandable_segments", "float8", "ddp_bucket_view", "ddp_static_graph")
DDP_KNOBS = ("ddp_bucket_view", "ddp_static_graph")
# float8 tensor cores: Ada (8.9) and Hopper (9.0) or later.
FLOAT8_CAPABILITY = 8.9
# The compile mode a float8 variant of an uncompiled configuration is tried with, in this
# order (the modes the late stage tries first on GPUs, search.late.CUDA_COMPILE_ORDER).
_FLOAT8_COMPILE = (CompileMode.REDUCE_OVERHEAD, CompileMode.DEFAULT, CompileMode.MAX_AUTOTUNE_NO_CUDAGRAPHS)
_PROBE_TIMEOUT_S = 120.0


@functools.lru_cache(maxsize=1)
def torchao_float8() -> str | None:
    """None where ``torchao.float8`` imports beside this torch, else why not. Imported in a
    child process: a torchao built for another torch fails at import, or loads its
    extensions with warnings, neither of which belongs in autotune's own process."""
    import importlib.util

    if importlib.util.find_spec("torchao") is None:
        return "torchao is not installed (pip install 'autotune[float8]')"
    try:
        proc = subprocess.run([sys.executable, "-c", "from torchao.float8 import convert_to_float8_training"],
                              capture_output=True, text=True, timeout=_PROBE_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"importing torchao.float8 failed: {exc}"
    if proc.returncode:
        last = (proc.stderr.strip().splitlines() or ["no message"])[-1]
        return f"torchao.float8 does not import beside this torch: {last}"
    return None


def expandable_segments_choice(device: str) -> tuple[list[Any], dict[str, str]]:
    """The CUDA allocator's expandable segments: fewer fragmented blocks, less memory
    reserved, at some cost per new mapping; measured like any knob."""
    if device != Device.CUDA:
        return [], {"expandable_segments": "an option of the CUDA caching allocator: no GPU here"}
    return [False, True], {}


def float8_choice(device: str, gpus: Sequence[GpuInfo], *, precisions: Sequence[Any],
                  compiles: Sequence[Any]) -> tuple[list[Any], dict[str, str]]:
    """float8 matmuls on GPUs of compute capability 8.9 or later with torchao, where the
    space holds bf16 and a compile mode (float8 runs under both)."""
    if device != Device.CUDA:
        return [], {"float8": "float8 training needs a CUDA GPU of compute capability 8.9 or later"}
    capability = min((float(g.compute_capability or 0) for g in gpus), default=0.0)
    reasons = []
    if capability < FLOAT8_CAPABILITY:
        reasons.append(f"needs a GPU of compute capability {FLOAT8_CAPABILITY} or later (Ada, Hopper), "
                       f"this one is {capability:g}")
    if Precision.BF16 not in precisions:
        reasons.append("runs under bf16 autocast, which is not searched here")
    if not any(c != CompileMode.OFF for c in compiles):
        reasons.append("needs torch.compile to fuse its casts, which is not searched here")
    if not reasons and (missing := torchao_float8()):
        reasons.append(missing)
    if reasons:
        return [], {"float8": "float8 training: " + "; ".join(reasons)}
    return [False, True], {}


def ddp_choices(device: str, max_ranks: int) -> tuple[list[Any], dict[str, str]]:
    """DDP's bucket view and static graph, for several ranks on GPUs (the values, and the
    reason for both knobs where they are not searched). A sharded configuration has no DDP
    (``normalised``)."""
    if device != Device.CUDA:
        why = "DistributedDataParallel's options are searched for several GPU ranks; this is a CPU run"
    elif max_ranks < 2:
        why = "DistributedDataParallel's options: one rank, no DDP"
    else:
        return [False, True], {}
    return [], {"ddp_bucket_view,ddp_static_graph": why}


def gpu_knob_choices(device: str, gpus: Sequence[GpuInfo], max_ranks: int,
                     choices: Mapping[str, Sequence[Any]]) -> tuple[dict[str, list[Any]], dict[str, str]]:
    """Each GPU knob's values (those searched) and the reasons for the others, given the
    other knobs' ``choices`` (precision and compile, which float8 needs)."""
    expandable, excluded = expandable_segments_choice(device)
    float8, why_not = float8_choice(device, gpus, precisions=choices.get("precision", [Precision.FP32]),
                                    compiles=choices.get("compile", [CompileMode.OFF]))
    ddp, why_not_ddp = ddp_choices(device, max_ranks)
    values = {"expandable_segments": expandable, "float8": float8,
              **{name: list(ddp) for name in DDP_KNOBS}}
    return {k: v for k, v in values.items() if v}, {**excluded, **why_not, **why_not_ddp}


def normalised(values: Mapping[str, KnobValue]) -> dict[str, KnobValue]:
    """A configuration's fields (``TrialConfig.to_dict()``) with the GPU knobs that cannot
    act turned off: float8 outside compiled bf16, the DDP knobs where there is no DDP (one
    rank, or a sharded model)."""
    out = dict(values)
    if out.get("precision") != Precision.BF16 or out.get("compile", CompileMode.OFF) == CompileMode.OFF:
        out["float8"] = False
    if int(out.get("nprocs") or 1) < 2 or out.get("sharding", Sharding.OFF) != Sharding.OFF:
        out.update({name: False for name in DDP_KNOBS})
    return out


def late_params(base: Mapping[str, KnobValue], name: str, value: KnobValue,
                choices: Mapping[str, Sequence[Any]]) -> dict[str, KnobValue]:
    """``base`` with the late knob ``name`` at ``value``; float8 on comes with what it needs:
    bf16, and where ``base`` is not compiled the first compile mode the space holds."""
    params = {**base, name: value}
    if name == "float8" and value:
        params["precision"] = Precision.BF16.value
        if params.get("compile", CompileMode.OFF) == CompileMode.OFF:
            params["compile"] = next((m.value for m in _FLOAT8_COMPILE if m in choices.get("compile", [])),
                                     params.get("compile"))
    return params
