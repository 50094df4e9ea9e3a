"""What the stack files share: the tuned knobs in the words of another tool (the DataLoader's
arguments, torch.compile's mode, the lines that checkpoint and shard the model's blocks),
the process environment each carries, and the knobs a tool's file cannot hold
(``not_expressible``), which the loop snippet covers.
"""
from __future__ import annotations

from collections.abc import Mapping

from autotune.config import TrialConfig
from autotune.emit import gpu_stacks, optimizer
from autotune.runtime.json_value import JsonObject
from autotune.runtime.knobs import Affinity, CompileMode, Device, LrScaling, Precision, Sharding

# What autotune's own launcher sets that other launchers do not need: they start the
# ranks themselves (TUNED_NPROCS) and set up their own rank group.
_OWN_LAUNCHER_ONLY = ("TUNED_NPROCS",)
# Read by train_tuned.py alone (its runtime pins each local rank to its cores).
_SCRIPT_ONLY = ("TUNED_CPUS_PER_RANK",)

# TF32 for matrix products only, in the API that replaced allow_tf32 (deprecated since
# torch 2.9), with the legacy flag kept in step: in torch 2.9-2.13 a reader of the legacy
# one (torch.compile's inductor, torch.get_float32_matmul_precision()) raises when only the
# new one was set. cuDNN's convolutions already use TF32 by default: forcing them either way
# would move the user off the defaults the baseline ran with.
TF32_LINES = ('torch.backends.cuda.matmul.fp32_precision = "tf32"',
              "torch.backends.cuda.matmul.allow_tf32 = True")
CUDNN_BENCHMARK_LINE = "torch.backends.cudnn.benchmark = True"


def process_environment(env: Mapping[str, str], *, for_train_tuned: bool) -> dict[str, str]:
    """The variables another launcher needs from autotune's: threads, allocator, binding."""
    drop = set(_OWN_LAUNCHER_ONLY) | (set() if for_train_tuned else set(_SCRIPT_ONLY))
    return {k: v for k, v in env.items() if k not in drop}


def compile_mode(cfg: TrialConfig) -> str | None:
    """torch.compile's mode, as Accelerate and Lightning users pass it; None when off.
    CUDA graphs do not exist on a CPU, so there max-autotune is the same compilation."""
    if cfg.compile == CompileMode.OFF:
        return None
    if cfg.compile == CompileMode.MAX_AUTOTUNE_NO_CUDAGRAPHS and cfg.device == Device.CPU:
        return CompileMode.MAX_AUTOTUNE.value
    return cfg.compile


def sharded(cfg: TrialConfig) -> bool:
    return cfg.sharding != Sharding.OFF and cfg.nprocs > 1


def accelerate_shards(cfg: TrialConfig) -> bool:
    """Whether Accelerate's own FSDP can hold the sharding: on accelerators only. On CPU its
    Accelerator() chooses MULTI_CPU before it looks at ACCELERATE_USE_FSDP or an fsdp_plugin,
    and wraps the model in DDP: the FSDP settings would be ignored without a word."""
    return sharded(cfg) and cfg.device == Device.CUDA


def blocks_text(blocks: tuple[str, ...]) -> str:
    """The block classes, as the stacks take them: names, comma-separated."""
    return ",".join(blocks) if blocks else "YourBlock"


def checkpoint_line(blocks: tuple[str, ...]) -> str:
    classes = ", ".join(blocks) if blocks else "YourBlock"
    return ("apply_activation_checkpointing(model, checkpoint_wrapper_fn=functools.partial(checkpoint_wrapper, "
            "checkpoint_impl=CheckpointImpl.NO_REENTRANT), "
            f"check_fn=lambda m: isinstance(m, ({classes},)))  # from "
            "torch.distributed.algorithms._checkpoint.checkpoint_wrapper")


def lr_line(cfg: TrialConfig) -> str | None:
    """What --scale-lr asks of the user's own optimizer (None when the factor is 1): the
    tools' files cannot hold it; train_tuned.py applies it itself."""
    if cfg.lr_factor == 1.0:
        return None
    ratio = f"{cfg.batch_size}/{cfg.lr_batch}"
    rule = ratio if cfg.lr_scaling == LrScaling.LINEAR else f"sqrt({ratio})"
    return (f"learning rate (--scale-lr {cfg.lr_scaling}): multiply every parameter group's lr by "
            f"{cfg.lr_factor:g} ({rule}, the global batch over yours): for group in optimizer.param_groups: "
            f"group['lr'] *= {cfg.lr_factor:g}; on N nodes the global batch is N x {cfg.batch_size}, "
            "and the factor follows it")


def not_expressible(cfg: TrialConfig, baseline: TrialConfig, *, tool: gpu_stacks.Tool,
                     blocks: tuple[str, ...] = ()) -> list[str]:
    """The tuned knobs a tool's configuration cannot hold (see the loop snippet)."""
    out = [line for line in (lr_line(cfg), optimizer.step_line(cfg)) if line]
    if cfg.activation_checkpointing and not sharded(cfg):
        # Both tools checkpoint activations only as part of their FSDP configuration.
        out.append(f"activation checkpointing of {blocks_text(blocks)}: {checkpoint_line(blocks)}")
    if cfg.channels_last != baseline.channels_last:
        out.append("channels_last: model.to(memory_format=torch.channels_last), inputs likewise")
    if cfg.interop_threads != baseline.interop_threads and cfg.interop_threads:
        out.append(f"interop threads: torch.set_num_interop_threads({cfg.interop_threads}) first thing")
    if cfg.precision == Precision.TF32:
        out.append(f"tf32: {'; '.join(TF32_LINES)} (the second for torch.compile, which reads it)")
    if cfg.cudnn_benchmark and tool != gpu_stacks.Tool.LIGHTNING:  # Lightning's Trainer(benchmark=True) holds it
        out.append(f"cuDNN benchmark mode: {CUDNN_BENCHMARK_LINE}")
    if cfg.prune_ratio:
        out.append(f"structured pruning ({cfg.prune_ratio:g}): train_tuned.py prunes; see its prune_model()")
    if cfg.affinity != Affinity.NONE:
        out.append("core pinning: train_tuned.py pins each rank (TUNED_CPUS_PER_RANK); elsewhere use taskset")
    if cfg.ipex:
        out.append("ipex: model, optimizer = intel_extension_for_pytorch.optimize(model, optimizer=optimizer)")
    if tool == gpu_stacks.Tool.ACCELERATE:
        out.append(f"DataLoader: {loader_kwargs_text(cfg)} (Accelerate takes your DataLoader as it is)")
    return out + gpu_stacks.not_expressible(cfg, tool=tool)


def loader_kwargs(cfg: TrialConfig) -> JsonObject:
    """The DataLoader arguments of one process: the global batch split over the ranks, and
    with gradient accumulation over its micro-batches (the stacks accumulate loader batches)."""
    kwargs: JsonObject = {"batch_size": cfg.micro_batch, "num_workers": cfg.num_workers,
                              "pin_memory": cfg.pin_memory and cfg.device == Device.CUDA, "drop_last": True}
    if cfg.num_workers:
        kwargs["persistent_workers"] = cfg.persistent_workers
        if cfg.prefetch_factor:
            kwargs["prefetch_factor"] = cfg.prefetch_factor
    return kwargs


def loader_kwargs_text(cfg: TrialConfig) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in loader_kwargs(cfg).items())


def checkpoint_code(blocks: tuple[str, ...]) -> list[str]:
    return ["from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (",
            "    CheckpointImpl, apply_activation_checkpointing, checkpoint_wrapper)",
            "import functools",
            checkpoint_line(blocks).split("  # from")[0] + "  # recompute each block's activations in backward"]


def shard_code(cfg: TrialConfig, blocks: tuple[str, ...], *, mesh: str = "") -> list[str]:
    """fully_shard over each block, then the whole model; ``mesh``: the argument naming the
    ranks' mesh where a tool holds one (Lightning's ``self.device_mesh``)."""
    classes = ", ".join(blocks) if blocks else "YourBlock"
    raf = f"{mesh}reshard_after_forward={cfg.sharding == Sharding.FULL}"
    return ["from torch.distributed.fsdp import fully_shard  # instead of DistributedDataParallel",
            f"for block in [m for m in model.modules() if isinstance(m, ({classes},))]:",
            f"    fully_shard(block, {raf})  # each block its own unit",
            f"fully_shard(model, {raf})  # then the rest"]
