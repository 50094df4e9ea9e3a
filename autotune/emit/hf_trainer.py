"""hf_training_args.json: the tuned configuration as Hugging Face ``TrainingArguments``,
written beside the other stack files (emit.stacks; emit.outputs writes both).

``TrainingArguments(output_dir=..., **doc["training_args"])`` builds the Trainer's
arguments; ``launch`` is the command that starts the ranks, ``env`` what no argument holds
(threads, the allocator), and ``not_expressible`` names, a sentence each, what the Trainer
cannot set, so that nothing is dropped silently. Every key exists in TrainingArguments
of transformers 5.17 and 5.24; where a name changed, the one both accept is used (FSDP's
is the current one), and ``key_names`` says what the other releases call it.
"""
from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from pathlib import Path

from autotune.config import TrialConfig
from autotune.emit import stack_knobs
from autotune.outdir import write_atomically
from autotune.runtime.json_value import JsonObject
from autotune.runtime.knobs import Affinity, CompileMode, Device, OptimizerStep, Precision, Sharding

HF_NAME = "hf_training_args.json"

# The names that changed, as a user of an older transformers needs them.
KEY_NAMES = {
    # the newer name breaks the older releases (5.17 has no such field), the older works in all
    "gradient_checkpointing": ("activation_checkpointing in transformers releases after 5.17 (gradient_checkpointing "
                               "is a deprecated alias there, to be removed in v6); 5.17 and 4.x know only this one"),
    "fsdp": ("fsdp=True with fsdp_config's reshard_after_forward (FSDP2) in 5.x; transformers 4.x took "
             "fsdp=\"full_shard\" (reshard_after_forward true) or \"shard_grad_op\" (false)"),
}


def _trainer_shards(cfg: TrialConfig) -> bool:
    """The Trainer shards through Accelerate, whose FSDP runs on GPUs only: on CPU it picks
    MULTI_CPU first and replicates the model with DDP (see stack_knobs.accelerate_shards)."""
    return stack_knobs.accelerate_shards(cfg)


def training_args(cfg: TrialConfig, *, blocks: tuple[str, ...] = ()) -> JsonObject:
    """``TrainingArguments`` keyword arguments for ``cfg``; ``blocks``: the model's repeated
    block classes, which FSDP wraps each on its own."""
    cuda = cfg.device == Device.CUDA
    args: JsonObject = {
        # the Trainer's batch is one rank's micro-batch: the global batch over ranks and accumulation
        "per_device_train_batch_size": cfg.micro_batch,
        "gradient_accumulation_steps": cfg.grad_accum,
        "bf16": cfg.precision == Precision.BF16,
        "fp16": cfg.precision == Precision.FP16,
        "dataloader_num_workers": cfg.num_workers,
        "dataloader_pin_memory": bool(stack_knobs.loader_kwargs(cfg)["pin_memory"]),
        "dataloader_persistent_workers": cfg.persistent_workers and cfg.num_workers > 0,
        "dataloader_drop_last": True,  # as the trials and train_tuned.py load
    }
    if cfg.optimizer_step == OptimizerStep.FUSED:
        # the Trainer builds its optimizer from `optim`; the user's own class is named in not_expressible
        args["optim"] = "adamw_torch_fused"
    if cfg.num_workers and cfg.prefetch_factor:  # TrainingArguments refuses it without workers
        args["dataloader_prefetch_factor"] = cfg.prefetch_factor
    if cfg.compile != CompileMode.OFF:
        args["torch_compile"] = True
        mode = stack_knobs.compile_mode(cfg)
        if mode != CompileMode.DEFAULT:
            args["torch_compile_mode"] = mode
    if cuda and cfg.precision == Precision.TF32:
        args["tf32"] = True
    elif cuda and cfg.compile != CompileMode.OFF:
        # left unset, torch_compile turns TF32 on (matrix products too), which the tuned run did not
        args["tf32"] = False
    if cfg.activation_checkpointing and not _trainer_shards(cfg):
        args["gradient_checkpointing"] = True
    if cfg.nprocs > 1:
        args["ddp_backend"] = cfg.backend
    if _trainer_shards(cfg):
        args["fsdp"] = True
        args["fsdp_config"] = {
            "version": 2, "reshard_after_forward": cfg.sharding == Sharding.FULL,
            "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            "transformer_layer_cls_to_wrap": list(blocks) or ["YourBlock"],
            "activation_checkpointing": cfg.activation_checkpointing,
            "state_dict_type": "FULL_STATE_DICT"}
    elif cfg.nprocs > 1:
        # the trials' DDP finds no unused parameters: searching for them costs a pass over the graph
        args["ddp_find_unused_parameters"] = False
    if not cuda:
        args["use_cpu"] = True
    return args


def not_expressible(cfg: TrialConfig, baseline: TrialConfig, env: Mapping[str, str], *,
                    blocks: tuple[str, ...] = ()) -> list[str]:
    """What TrainingArguments cannot hold, a sentence each, with what does it instead."""
    out = []
    if cfg.threads:
        out.append(f"Threads per rank: the Trainer sets none; OMP_NUM_THREADS={cfg.threads} in the environment "
                   "(see env) before Python starts sets them.")
    if cfg.interop_threads != baseline.interop_threads and cfg.interop_threads:
        out.append(f"Interop threads: call torch.set_num_interop_threads({cfg.interop_threads}) first thing.")
    if "LD_PRELOAD" in env:
        out.append(f"The {cfg.allocator} allocator: LD_PRELOAD (see env) must be set before Python starts.")
    if cfg.affinity != Affinity.NONE:
        out.append("Core pinning: train_tuned.py pins each rank to its cores (TUNED_CPUS_PER_RANK); "
                   "under the Trainer use taskset or numactl.")
    if cfg.channels_last != baseline.channels_last:
        out.append("channels_last: model.to(memory_format=torch.channels_last) before the Trainer, and "
                   "each image batch likewise (a data collator can convert it).")
    if cfg.prune_ratio:
        out.append(f"Structured pruning ({cfg.prune_ratio:g} of channels): prune the model before the "
                   "Trainer as train_tuned.py's prune_model() does.")
    if cfg.cudnn_benchmark:
        out.append(f"cuDNN benchmark mode: {stack_knobs.CUDNN_BENCHMARK_LINE} before training.")
    if cfg.device == Device.CUDA and cfg.compile != CompileMode.OFF and cfg.precision != Precision.TF32:
        out.append("tf32=False keeps torch.compile from turning TF32 on; where transformers sets it for all "
                   "of torch (torch.backends.fp32_precision, as 5.24 does) it turns it off in cuDNN's convolutions "
                   "too, which the tuned run left on (PyTorch's default): set "
                   'torch.backends.cudnn.conv.fp32_precision = "tf32" after building TrainingArguments.')
    if cfg.ipex:
        out.append("IPEX: model, optimizer = intel_extension_for_pytorch.optimize(model, optimizer=optimizer), "
                   "then pass both to the Trainer (optimizers=(optimizer, None)).")
    if cfg.activation_checkpointing and not _trainer_shards(cfg):
        out.append("gradient_checkpointing=True calls model.gradient_checkpointing_enable(), which a "
                   f"transformers model has; for another torch module, checkpoint {stack_knobs.blocks_text(blocks)} "
                   f"yourself: {stack_knobs.checkpoint_line(blocks)}.")
    if stack_knobs.sharded(cfg) and not _trainer_shards(cfg):
        out.append(f"Sharding ({cfg.sharding}): the Trainer's FSDP runs on GPUs only (on CPU Accelerate "
                   "replicates the model with DDP); apply_to_your_loop.md shards it with fully_shard.")
    if cfg.optimizer_step == OptimizerStep.FUSED:
        out.append("The fused optimizer step: optim=adamw_torch_fused is AdamW's; for another torch.optim "
                   "class build it with fused=True and pass it (optimizers=(optimizer, None)).")
    if cfg.optimizer_step == OptimizerStep.FOREACH and cfg.device == Device.CPU:
        out.append("The foreach optimizer step: optim=adamw_torch picks it on CUDA only; on CPU build "
                   "torch.optim.AdamW(..., foreach=True) and pass it (optimizers=(optimizer, None)).")
    lr = stack_knobs.lr_line(cfg)
    if lr:
        out.append(f"The learning-rate rule, {lr} (or set learning_rate to yours times {cfg.lr_factor:g}).")
    return out


def launch_command(cfg: TrialConfig, env: Mapping[str, str]) -> str:
    """The command that starts the ranks, the environment in front."""
    prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    command = ("python your_script.py" if cfg.nprocs == 1 else
               f"torchrun --nnodes 1 --nproc-per-node {cfg.nprocs} --rdzv-backend c10d "
               "--rdzv-endpoint 127.0.0.1:0 your_script.py")
    return f"{prefix} {command}" if prefix else command


def hf_document(cfg: TrialConfig, baseline: TrialConfig, env: Mapping[str, str], *,
                blocks: tuple[str, ...] = ()) -> JsonObject:
    """The whole of hf_training_args.json."""
    shown_env = stack_knobs.process_environment(env, for_train_tuned=False)
    args = training_args(cfg, blocks=blocks)
    return {
        "training_args": args,
        "launch": launch_command(cfg, shown_env),
        "env": shown_env,
        "not_expressible": not_expressible(cfg, baseline, env, blocks=blocks),
        "usage": "TrainingArguments(output_dir=..., **doc['training_args']) with doc = "
                 f"json.load(open('{HF_NAME}')); run it with the launch command",
        "key_names": {k: v for k, v in KEY_NAMES.items() if k in args},
    }


def write_hf_arguments(out_dir: Path, *, cfg: TrialConfig, baseline: TrialConfig, env: Mapping[str, str],
                       default_threads: int | None = None, blocks: tuple[str, ...] = ()) -> dict[str, str]:
    """Write hf_training_args.json into ``out_dir``; returns its name by output key. Threads
    left to PyTorch are named as ``default_threads``, the count it chose here, as the other
    stack files name them (stacks.write_stack_files): torchrun would choose 1 per rank."""
    if default_threads:
        cfg, baseline = (c if c.threads else c.replace(threads=default_threads) for c in (cfg, baseline))
        env = {"OMP_NUM_THREADS": str(default_threads), **env}
    write_atomically(out_dir / HF_NAME, json.dumps(hf_document(cfg, baseline, env, blocks=blocks), indent=2) + "\n")
    return {"hf_trainer": HF_NAME}
