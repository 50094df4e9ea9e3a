"""What the knobs did, read from this process and from a training step: the trials
report these facts, and train_tuned.py --report writes the same ones, so a knob is
checked the same way in both. And what differs from the machine a configuration was
tuned on."""
from __future__ import annotations

import dataclasses
import os
from typing import Any

import torch

from . import gpu_knobs, memory_knobs
from .data import first_tensor
from .json_value import JsonObject
from .knobs import Device, OptimizerStep
from .model import config_lr_factor, first_lr, unwrap_model
from .optimizer_step import optimizer_facts
from .process_facts import ProcessFacts
from .session import Session


def machine_differences(tuned_for: JsonObject) -> list[str]:
    """Cheap checks that this machine is the kind the configuration was tuned on: a
    config tuned for 16 cores and run on 4 is no longer the fastest."""
    here = {"usable_cores": len(os.sched_getaffinity(0)),
            "torch_version": torch.__version__,
            "gpu_count": torch.cuda.device_count() if torch.cuda.is_available() else 0}
    try:
        with open("/proc/cpuinfo") as f:
            models = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        here["cpu_model"] = models[0] if models else None
    except OSError:
        pass
    return [f"{key}: tuned on {tuned_for[key]!r}, here {value!r}" for key, value in here.items()
            if key in tuned_for and tuned_for[key] is not None and value is not None
            and tuned_for[key] != value]


def mapped_libraries() -> list[str]:
    """Shared objects mapped into this process: shows which allocator is loaded."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if ".so" in line}
    except OSError:
        return []
    return sorted(os.path.basename(p) for p in paths if p.startswith("/"))


# The environment variables through which the process knobs act.
PROCESS_ENV = ("OMP_NUM_THREADS", "LD_PRELOAD", "MALLOC_CONF", "OMP_PROC_BIND", "OMP_PLACES",
               "TUNED_CPUS_PER_RANK", "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", gpu_knobs.ALLOC_CONF)


def process_facts() -> ProcessFacts:
    """What the process-level knobs did to this process."""
    return ProcessFacts(
        threads=torch.get_num_threads(),
        interop_threads=torch.get_num_interop_threads(),
        affinity=sorted(os.sched_getaffinity(0)),
        libraries=mapped_libraries(),
        env={k: os.environ.get(k) for k in PROCESS_ENV},
    )


def step_facts(session: Session) -> tuple[torch.Tensor, JsonObject]:
    """Run one training step (its loss is returned) with hooks that record what the
    in-process knobs did:
    activation dtypes (precision), memory format of conv inputs (channels_last), the
    per-rank batch, layer widths (pruning), compiled and DDP wrappers; the memory knobs'
    checkpointed blocks, the model's calls in a step and what each got (grad_accum's
    micro-batches), and whether the parameters are sharded with this rank's share; the
    learning-rate factor and the first group's learning rate; the optimizer's step
    implementation and the loader's prefetch factor. Only ever written (a trial's FACTS
    event, train_tuned.py's report) and compared key by key: a JSON object."""
    dtypes: set[str] = set()
    conv_inputs_channels_last: list[bool] = []
    hooks = []
    calls: list[int | None] = []  # per call of the model, its first input's dim 0

    def record(module: torch.nn.Module, args: tuple, output: Any) -> None:
        if isinstance(output, torch.Tensor) and output.is_floating_point():
            dtypes.add(str(output.dtype).replace("torch.", ""))
        # A 1-channel input is trivially channels_last: only wider inputs tell.
        if (isinstance(module, torch.nn.Conv2d) and module.in_channels > 1
                and args and isinstance(args[0], torch.Tensor)):
            conv_inputs_channels_last.append(args[0].is_contiguous(memory_format=torch.channels_last))

    uncompiled = getattr(session.model, "_orig_mod", session.model)
    base = unwrap_model(session.model)
    # A sharded model is compiled block by block, in place (Module.compile)
    compiled = (type(session.model).__name__ == "OptimizedModule"
                or any(getattr(m, "_compiled_call_impl", None) is not None for m in base.modules()))
    # Hooks on a compiled model would make dynamo recompile twice (on adding and on
    # removing them), inside the warm-up that calibrates the windows: not for them.
    for module in base.modules() if not compiled else ():
        if not list(module.children()):
            hooks.append(module.register_forward_hook(record))

    def count(module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        t = first_tensor((args, kwargs))
        calls.append(int(t.shape[0]) if t is not None and t.dim() > 0 else None)

    block_calls = [0]

    def count_block(module: torch.nn.Module, args: tuple) -> None:
        block_calls[0] += 1

    if not compiled:
        hooks.append(base.register_forward_pre_hook(count, with_kwargs=True))
        # A checkpointed block runs its forward again in the backward pass.
        hooks += [b.register_forward_pre_hook(count_block) for b in memory_knobs.inner_blocks(base)]
    batch = session.next_batch()
    first = first_tensor(batch)
    try:
        loss = session.train_step(batch)
    finally:
        for h in hooks:
            h.remove()
    held, total = memory_knobs.local_share(base)
    return loss, {
        "activation_dtypes": sorted(dtypes),
        "conv_inputs_channels_last": conv_inputs_channels_last[:1],
        "per_rank_batch": int(first.shape[0]) if first is not None and first.dim() > 0 else None,
        "layer_widths": {
            name.replace(memory_knobs.CHECKPOINT_PREFIX, ""):
                (m.out_channels if hasattr(m, "out_channels") else m.out_features)
            for name, m in base.named_modules()
            if isinstance(m, (torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d, torch.nn.Linear))
        },
        "parameters": sum(p.numel() for p in base.parameters()),
        "compiled": compiled,
        "ddp": isinstance(uncompiled, torch.nn.parallel.DistributedDataParallel),
        **gpu_knobs.ddp_facts(uncompiled),
        "float8_layers": gpu_knobs.float8_layers(base),
        "cuda_expandable_segments": gpu_knobs.expandable_in_use(session.dist.device),
        "checkpointed_blocks": memory_knobs.checkpointed_blocks(base),
        # None under compile, whose graphs the hook would change
        "model_calls": len(calls) if not compiled else None,
        "micro_batch": calls[0] if calls else None,
        "block_calls": block_calls[0] if not compiled else None,
        "sharded": memory_knobs.is_sharded(base),
        "parameters_held": held,  # this rank's share of the parameters' elements
        "parameter_share": held / total if total else None,
        "world": session.dist.world,
        "backend": session.dist.backend,
        # --scale-lr: the factor the learning rates were multiplied by, and the first
        # parameter group's learning rate as the optimizer holds it
        "lr_factor": config_lr_factor(session.cfg, nodes=session.dist.nodes),
        "lr": first_lr(session.optimizer),
        # optimizer_step: the class, its fused/foreach flags and groups as the step runs them
        "optimizer": optimizer_facts(session.optimizer,
                                     str(session.cfg.get("optimizer_step") or OptimizerStep.DEFAULT)),
        # prefetch_factor: the batches each worker loads ahead (torch's 2 where unset; None
        # without workers)
        "loader_prefetch_factor": getattr(session.loader, "prefetch_factor", None),
    }


def process_peak_mb(device: torch.device) -> float:
    """What this process held at its peak, in MiB: its resident set's high-water mark on
    CPU (train_tuned.py's process trains one configuration from its start), the caching
    allocator's reservation on CUDA."""
    if device.type == Device.CUDA:
        return torch.cuda.max_memory_reserved(device) / 2**20
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@dataclasses.dataclass(frozen=True)
class CudaMemory:
    """This rank's GPU memory at its peak and the GPU's size, in MiB (None off CUDA)."""

    peak_mb: float | None
    total_mb: float | None


def cuda_memory(device: torch.device) -> CudaMemory:
    """This rank's GPU memory at its peak and the GPU's size. Reserved, not allocated: the
    caching allocator's reservation is what another batch size or process on the GPU
    would find taken."""
    if device.type != Device.CUDA:
        return CudaMemory(peak_mb=None, total_mb=None)
    return CudaMemory(peak_mb=torch.cuda.max_memory_reserved(device) / 2**20,
                      total_mb=torch.cuda.get_device_properties(device).total_memory / 2**20)
