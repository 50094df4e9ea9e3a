"""The tuned configuration for the user's own stack, written beside best_config.json:
an Accelerate config file, the Lightning ``Trainer`` arguments, a torchrun script, the
lines to change in a hand-written training loop, and a Slurm batch script for several
nodes (emit.slurm).

Each tool expresses only some knobs; what one cannot (channels_last, interop threads,
TF32, cuDNN's benchmark mode outside Lightning, the DataLoader's arguments under
Accelerate, structured pruning, core pinning, activation checkpointing without
sharding, Accelerate's sharding on CPU) is named in that file and covered by the loop
snippet, never dropped silently. The memory knobs name the model's repeated block classes
(``Task.blocks``): what is checkpointed and what each shards on its own. The process
environment (threads, the allocator's preload) goes with each, since no tool sets it.
"""
from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from autotune.config import TrialConfig
from autotune.emit import gpu_stacks, nodes, optimizer, slurm
from autotune.emit.launch import keep_or_export
from autotune.emit.outdir import write_atomically
from autotune.runtime.knobs import CompileMode, LrScaling, Precision, Sharding

ACCELERATE_NAME = "accelerate_config.yaml"
LIGHTNING_NAME = "lightning_trainer.json"
TORCHRUN_NAME = "torchrun.sh"
SNIPPET_NAME = "apply_to_your_loop.md"

# What autotune's own launcher sets that other launchers do not need: they start the
# ranks themselves (TUNED_NPROCS) and set up their own rank group.
_OWN_LAUNCHER_ONLY = ("TUNED_NPROCS",)
# Read by train_tuned.py alone (its runtime pins each local rank to its cores).
_SCRIPT_ONLY = ("TUNED_CPUS_PER_RANK",)

_ACCELERATE_PRECISION: dict[str, str] = {
    Precision.FP32: "no", Precision.TF32: "no", Precision.BF16: "bf16", Precision.FP16: "fp16"}
_LIGHTNING_PRECISION: dict[str, str] = {
    Precision.FP32: "32-true", Precision.TF32: "32-true", Precision.BF16: "bf16-mixed", Precision.FP16: "16-mixed"}
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


def _compile_mode(cfg: TrialConfig) -> str | None:
    """torch.compile's mode, as Accelerate and Lightning users pass it; None when off.
    CUDA graphs do not exist on a CPU, so there max-autotune is the same compilation."""
    if cfg.compile == CompileMode.OFF:
        return None
    if cfg.compile == CompileMode.MAX_AUTOTUNE_NO_CUDAGRAPHS and cfg.device == "cpu":
        return CompileMode.MAX_AUTOTUNE.value
    return cfg.compile


def _sharded(cfg: TrialConfig) -> bool:
    return cfg.sharding != Sharding.OFF and cfg.nprocs > 1


def _accelerate_shards(cfg: TrialConfig) -> bool:
    """Whether Accelerate's own FSDP can hold the sharding: on accelerators only. On CPU its
    Accelerator() chooses MULTI_CPU before it looks at ACCELERATE_USE_FSDP or an fsdp_plugin,
    and wraps the model in DDP: the FSDP settings would be ignored without a word."""
    return _sharded(cfg) and cfg.device == "cuda"


def _blocks_text(blocks: tuple[str, ...]) -> str:
    """The block classes, as the stacks take them: names, comma-separated."""
    return ",".join(blocks) if blocks else "YourBlock"


def _checkpoint_line(blocks: tuple[str, ...]) -> str:
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


def _not_expressible(cfg: TrialConfig, baseline: TrialConfig, *, tool: str,
                     blocks: tuple[str, ...] = ()) -> list[str]:
    """The tuned knobs a tool's configuration cannot hold (see the loop snippet)."""
    out = [line for line in (lr_line(cfg), optimizer.step_line(cfg)) if line]
    if cfg.activation_checkpointing and not _sharded(cfg):
        # Both tools checkpoint activations only as part of their FSDP configuration.
        out.append(f"activation checkpointing of {_blocks_text(blocks)}: {_checkpoint_line(blocks)}")
    if cfg.channels_last != baseline.channels_last:
        out.append("channels_last: model.to(memory_format=torch.channels_last), inputs likewise")
    if cfg.interop_threads != baseline.interop_threads and cfg.interop_threads:
        out.append(f"interop threads: torch.set_num_interop_threads({cfg.interop_threads}) first thing")
    if cfg.precision == Precision.TF32:
        out.append(f"tf32: {'; '.join(TF32_LINES)} (the second for torch.compile, which reads it)")
    if cfg.cudnn_benchmark and tool != "lightning":  # Lightning's Trainer(benchmark=True) holds it
        out.append(f"cuDNN benchmark mode: {CUDNN_BENCHMARK_LINE}")
    if cfg.prune_ratio:
        out.append(f"structured pruning ({cfg.prune_ratio:g}): train_tuned.py prunes; see its prune_model()")
    if cfg.affinity != "none":
        out.append("core pinning: train_tuned.py pins each rank (TUNED_CPUS_PER_RANK); elsewhere use taskset")
    if cfg.ipex:
        out.append("ipex: model, optimizer = intel_extension_for_pytorch.optimize(model, optimizer=optimizer)")
    if tool == "accelerate":
        out.append(f"DataLoader: {_loader_kwargs_text(cfg)} (Accelerate takes your DataLoader as it is)")
    return out + gpu_stacks.not_expressible(cfg, tool=tool)


def loader_kwargs(cfg: TrialConfig) -> dict[str, Any]:
    """The DataLoader arguments of one process: the global batch split over the ranks, and
    with gradient accumulation over its micro-batches (the stacks accumulate loader batches)."""
    kwargs: dict[str, Any] = {"batch_size": cfg.micro_batch, "num_workers": cfg.num_workers,
                              "pin_memory": cfg.pin_memory and cfg.device == "cuda", "drop_last": True}
    if cfg.num_workers:
        kwargs["persistent_workers"] = cfg.persistent_workers
        if cfg.prefetch_factor:
            kwargs["prefetch_factor"] = cfg.prefetch_factor
    return kwargs


def _loader_kwargs_text(cfg: TrialConfig) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in loader_kwargs(cfg).items())


def _accelerate_fsdp(cfg: TrialConfig, blocks: tuple[str, ...]) -> dict[str, Any]:
    """Accelerate's FSDP2 settings: each block class its own unit (as the runtime shards),
    resharded after forward or not, checkpointed or not, saved as one full state dict."""
    return {"fsdp_version": 2, "fsdp_reshard_after_forward": cfg.sharding == Sharding.FULL,
            "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            "fsdp_transformer_layer_cls_to_wrap": _blocks_text(blocks),
            "fsdp_activation_checkpointing": cfg.activation_checkpointing,
            "fsdp_state_dict_type": "FULL_STATE_DICT", "fsdp_offload_params": False,
            "fsdp_cpu_ram_efficient_loading": False}


def render_accelerate(cfg: TrialConfig, baseline: TrialConfig, env: Mapping[str, str], *,
                      blocks: tuple[str, ...] = ()) -> str:
    """``accelerate launch --config_file accelerate_config.yaml your_script.py``. Threads
    per process are not a config-file key: Accelerate takes them from OMP_NUM_THREADS (or
    ``--num_cpu_threads_per_process``), so the command in the header sets them; nor is
    gradient accumulation, which Accelerator() reads from ACCELERATE_GRADIENT_ACCUMULATION_STEPS.
    Sharding is Accelerate's FSDP2 over ``blocks``, the model's repeated block classes, on
    GPUs; on CPU, where Accelerate has no FSDP, the file gives the lines that shard the model
    before ``accelerator.prepare``, which then prepares the rest."""
    several = cfg.nprocs > 1
    distributed = ("MULTI_GPU" if cfg.device == "cuda" else "MULTI_CPU") if several else "NO"
    if _accelerate_shards(cfg):
        distributed = "FSDP"
    fields: dict[str, Any] = {
        "compute_environment": "LOCAL_MACHINE", "debug": False, "distributed_type": distributed,
        "mixed_precision": _ACCELERATE_PRECISION[cfg.precision], "use_cpu": cfg.device == "cpu",
        "num_processes": cfg.nprocs, "num_machines": 1, "machine_rank": 0,
        "main_process_ip": "127.0.0.1", "main_process_port": 0, "rdzv_backend": "static",
        "same_network": True, "downcast_bf16": False, "enable_cpu_affinity": False,
        "main_training_function": "main",
    }
    mode = _compile_mode(cfg)
    if mode is not None:
        fields["dynamo_config"] = {"dynamo_backend": "INDUCTOR", "dynamo_mode": mode}
    if cfg.device == "cuda":
        fields["gpu_ids"] = "all"
    if _accelerate_shards(cfg):
        fields["fsdp_config"] = _accelerate_fsdp(cfg, blocks)
    shown_env = process_environment(env, for_train_tuned=False)
    if cfg.grad_accum > 1:
        shown_env["ACCELERATE_GRADIENT_ACCUMULATION_STEPS"] = str(cfg.grad_accum)
    threads = f" --num_cpu_threads_per_process {cfg.threads}" if cfg.threads and cfg.device == "cpu" else ""
    command = f"accelerate launch --config_file {ACCELERATE_NAME}{threads} your_script.py"
    lines = ["# Generated by autotune: the tuned configuration for Accelerate."]
    if several and cfg.device == "cpu":
        # accelerate launch starts several CPU processes only through mpirun; torchrun
        # starts them as well, and Accelerator() reads this configuration from the
        # variables accelerate launch would have set.
        shown_env = {**shown_env, "ACCELERATE_USE_CPU": "true",
                     "ACCELERATE_MIXED_PRECISION": fields["mixed_precision"]}
        if mode is not None:
            shown_env.update(ACCELERATE_DYNAMO_BACKEND="INDUCTOR", ACCELERATE_DYNAMO_MODE=mode)
        command = (f"python -m torch.distributed.run --nnodes 1 --nproc-per-node {cfg.nprocs} "
                   "--rdzv-backend c10d --rdzv-endpoint 127.0.0.1:0 your_script.py")
        lines.append("# Several CPU processes: accelerate launch starts them only through mpirun (add an "
                     "mpirun_config); without MPI, run the line below, which starts them with torchrun.")
    prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in shown_env.items())
    lines += [f"# Run: {prefix + ' ' if prefix else ''}{command}",
              "# The environment in front carries what no config key holds (threads, the allocator).",
              f"# Per-process batch size: {cfg.batch_size // cfg.nprocs} (global {cfg.batch_size})."]
    if cfg.grad_accum > 1:
        lines.append(f"# Gradient accumulation: DataLoader batches of {cfg.micro_batch}, {cfg.grad_accum} per "
                     "optimizer step; wrap each step in `with accelerator.accumulate(model):`.")
    lines += [f"# Not expressible here, do it in your script: {item}"
              for item in _not_expressible(cfg, baseline, tool="accelerate", blocks=blocks)]
    if _sharded(cfg) and not _accelerate_shards(cfg):
        lines += _accelerate_cpu_sharding(cfg, blocks)
    if several:
        lines.append("# Several processes meet through torchrun's store, which listens on every interface;"
                     " autotune's launch.sh does not.")
    lines += _several_nodes_accelerate(cfg, several=several)
    lines += _yaml(fields)
    return "\n".join(lines) + "\n"


def _accelerate_cpu_sharding(cfg: TrialConfig, blocks: tuple[str, ...]) -> list[str]:
    """Sharding on CPU, where Accelerate has no FSDP: the model is sharded (and checkpointed
    first) in the script, and prepare() takes the rest, since it would wrap the shards in DDP."""
    knobs = f"sharding ({cfg.sharding}) of {_blocks_text(blocks)}" + (
        ", activation checkpointing" if cfg.activation_checkpointing else "")
    code = (_checkpoint_code(blocks) if cfg.activation_checkpointing else []) + _shard_code(cfg, blocks)
    code += ["optimizer = ...  # your optimizer, built after fully_shard: it takes the shards (DTensors)",
             "optimizer, loader = accelerator.prepare(optimizer, loader)  # not the model: "
             "prepare(model) would wrap the shards in DDP"]
    if cfg.grad_accum > 1:
        code.append("# in `with accelerator.accumulate(model):`, before backward: "
                    "model.set_requires_gradient_sync(accelerator.sync_gradients)")
    if cfg.precision in (Precision.BF16, Precision.FP16):
        code.append("# the forward pass and the loss in `with accelerator.autocast():` (prepare(model) "
                    "would have done it)")
    mode = _compile_mode(cfg)
    if mode is not None:
        code.append(f'model.compile(mode="{mode}")  # after fully_shard (prepare(model) would have done it)')
    return [f"# Not expressible here, do it in your script: {knobs}: Accelerate runs FSDP on GPUs only "
            "(on CPU, Accelerator() ignores its FSDP settings and replicates the model with DDP);",
            "#   shard the model yourself, before accelerator.prepare:",
            *(f"#     {line}" for line in code)]


def _several_nodes_accelerate(cfg: TrialConfig, *, several: bool) -> list[str]:
    """How the Accelerate file runs on N nodes: it describes one."""
    per_process = cfg.batch_size // cfg.nprocs
    interface = "GLOO_SOCKET_IFNAME" + (" and NCCL_SOCKET_IFNAME" if cfg.device == "cuda" else "")
    lines = [
        "# Several nodes (N): on node R (0 on the node whose address the others reach) set "
        "num_machines: N, machine_rank: R,",
        "#   main_process_ip: node 0's address, main_process_port: a free port, the same on every node "
        "(or pass --num_machines N",
        "#   --machine_rank R --main_process_ip HOST --main_process_port PORT to accelerate launch).",
        f"#   Keep the per-process batch {per_process}: the global batch becomes N x {cfg.batch_size}, "
        "so mind the learning rate.",
        f"#   {interface} must name the interface the nodes share (not lo); "
        "autotune tuned one node, not the network between nodes.",
    ]
    if several and cfg.device == "cpu":
        lines.append("#   With the torchrun line above: --nnodes N --node-rank R --rdzv-endpoint HOST:PORT "
                     "instead of --nnodes 1 and 127.0.0.1:0.")
    return lines


def _yaml(fields: Mapping[str, Any], indent: str = "") -> list[str]:
    """Flat YAML of scalars and one level of mappings, in the style accelerate writes."""
    out = []
    for key in sorted(fields):
        value = fields[key]
        if isinstance(value, Mapping):
            out.append(f"{indent}{key}:")
            out += _yaml(value, indent + "  ")
        else:
            out.append(f"{indent}{key}: {json.dumps(value)}")
    return out


def _lightning_strategy(cfg: TrialConfig, blocks: tuple[str, ...]) -> dict[str, Any] | None:
    """The strategy object's class and arguments: DDP, or with sharding FSDP over the block
    classes (Lightning's FSDPStrategy is FSDP1: its SHARD_GRAD_OP is grad-op's counterpart).
    FSDPStrategy refuses a CPU ("requires a GPU accelerator"): there ModelParallelStrategy
    runs FSDP2 over gloo, applied by the lines it gives for ``configure_model()``. Every key
    but class, note and configure_model is the constructor's keyword argument."""
    if cfg.nprocs == 1:
        return None
    if not _sharded(cfg):
        return {"class": "lightning.pytorch.strategies.DDPStrategy", "process_group_backend": cfg.backend,
                **gpu_stacks.ddp_kwargs(cfg), "note": "Trainer(strategy=DDPStrategy(process_group_backend=..., "
                "...)) to keep the tuned backend; the string \"ddp\" picks gloo on CPU and nccl on GPUs"}
    classes = list(blocks) or ["YourBlock"]
    if cfg.device == "cpu":
        code = ["model = self.model  # the network your LightningModule holds"]
        code += _checkpoint_code(blocks) if cfg.activation_checkpointing else []
        code += _shard_code(cfg, blocks, mesh='mesh=self.device_mesh["data_parallel"], ')
        return {"class": "lightning.pytorch.strategies.ModelParallelStrategy",
                "data_parallel_size": cfg.nprocs, "tensor_parallel_size": 1,
                "process_group_backend": cfg.backend, "save_distributed_checkpoint": False,
                "configure_model": code,
                "note": "Lightning's FSDPStrategy refuses accelerator=\"cpu\" (it requires a GPU): on CPU "
                        "ModelParallelStrategy runs FSDP2; put the configure_model lines in your "
                        "LightningModule's configure_model(), and build the optimizer in "
                        "configure_optimizers() from self.parameters() (the shards)"}
    strategy: dict[str, Any] = {
        "class": "lightning.pytorch.strategies.FSDPStrategy", "process_group_backend": cfg.backend,
        "sharding_strategy": "FULL_SHARD" if cfg.sharding == Sharding.FULL else "SHARD_GRAD_OP",
        "auto_wrap_policy": classes, "state_dict_type": "full",
        "note": "auto_wrap_policy (and activation_checkpointing_policy) take the classes themselves: "
                "{" + ", ".join(classes) + "} from your model file"}
    if cfg.activation_checkpointing:
        strategy["activation_checkpointing_policy"] = classes
    return strategy


def _lightning_strategy_name(cfg: TrialConfig) -> str:
    """Trainer(strategy=...): a registered name, or where none exists (FSDP2 on CPU) the
    class's, which Trainer refuses: ``doc["strategy"]`` builds the object."""
    if cfg.nprocs == 1:
        return "auto"
    if not _sharded(cfg):
        return "ddp"
    return "fsdp" if cfg.device == "cuda" else "ModelParallelStrategy"


def lightning_arguments(cfg: TrialConfig, baseline: TrialConfig, env: Mapping[str, str], *,
                        blocks: tuple[str, ...] = ()) -> dict[str, Any]:
    """``Trainer(**doc["trainer"])`` with the strategy built as ``doc["strategy"]`` says (an
    object JSON cannot hold), the DataLoader's arguments and the environment. ``blocks``:
    the model's repeated block classes, which sharding wraps and checkpointing recomputes."""
    trainer: dict[str, Any] = {"accelerator": "gpu" if cfg.device == "cuda" else "cpu", "devices": cfg.nprocs,
                               "num_nodes": 1, "precision": _LIGHTNING_PRECISION[cfg.precision],
                               "strategy": _lightning_strategy_name(cfg)}
    if cfg.cudnn_benchmark:
        trainer["benchmark"] = True
    if cfg.grad_accum > 1:
        trainer["accumulate_grad_batches"] = cfg.grad_accum
    doc: dict[str, Any] = {
        "trainer": trainer,
        "strategy": _lightning_strategy(cfg, blocks),
        "dataloader": loader_kwargs(cfg),
        "environment": process_environment(env, for_train_tuned=False),
        "compile": ({"mode": _compile_mode(cfg), "how": "model = torch.compile(model, mode=...) in "
                                                        "configure_model() or before fit()"}
                    if cfg.compile != CompileMode.OFF else None),
        "not_expressible": _not_expressible(cfg, baseline, tool="lightning", blocks=blocks),
        "several_nodes": {
            "num_nodes": "N nodes: Trainer(num_nodes=N) on every node; devices stays the tuned count per node",
            "launch": (f"on each node: torchrun --nnodes N --node-rank R --nproc-per-node {cfg.nprocs} "
                       "--rdzv-backend c10d --rdzv-endpoint HOST:PORT your_script.py (HOST: node 0's address; "
                       "Lightning reads torchrun's environment), or under Slurm srun with "
                       f"--ntasks-per-node={cfg.nprocs}"),
            "dataloader": (f"batch_size stays {loader_kwargs(cfg)['batch_size']} per process: the global "
                           f"batch becomes N x {cfg.batch_size}, so mind the learning rate"),
            "environment": ("GLOO_SOCKET_IFNAME" + (" and NCCL_SOCKET_IFNAME" if cfg.device == "cuda" else "")
                            + " must name the interface the nodes share, not lo"),
        },
    }
    return doc


def render_torchrun(cfg: TrialConfig, env: Mapping[str, str], *, python: str = sys.executable) -> str:
    """torchrun.sh: train_tuned.py under torchrun, as many ranks as tuned, rendezvous on
    127.0.0.1 (one node), or on N nodes at node 0 (``--nnodes N --node-rank R
    --rdzv-endpoint HOST:PORT``, see emit.nodes). torchrun's flags go before ``--``,
    train_tuned.py's after it (with no ``--`` every argument is the script's)."""
    py = shlex.quote(python)
    lines = [
        "#!/usr/bin/env bash",
        "# Generated by autotune: train_tuned.py under torchrun, with the tuned environment.",
        "# Usage: torchrun.sh [TORCHRUN FLAGS --] [train_tuned.py ARGS], e.g.",
        "#   torchrun.sh --max-restarts 3 -- --epochs 10 --resume",
        *nodes.usage_lines(TORCHRUN_NAME, restarts=False),
        "# torchrun's store listens on every interface (a torch limitation); launch.sh starts the",
        "# ranks itself over loopback only.",
        "set -euo pipefail",
        'here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"',
        f'if [ -z "${{PYTHON:-}}" ]; then if [ -x {py} ]; then PYTHON={py}; else PYTHON=python3; fi; fi',
        *nodes.parse_lines(TORCHRUN_NAME, restarts=False, keep_double_dash=True, unused_on_one_node=("--iface",)),
    ]
    one_node: list[str] = []  # over loopback
    for key, value in process_environment(env, for_train_tuned=True).items():
        line = keep_or_export(key, value, script=TORCHRUN_NAME)
        (one_node if key in nodes.INTERFACE_VARIABLES else lines).append(line)
    lines += [
        "flags=()",
        "if printf '%s\\n' \"$@\" | grep -qx -- '--'; then",
        '  while [ "$1" != "--" ]; do flags+=("$1"); shift; done',
        "  shift",
        "fi",
        'if [ "$nnodes" = 1 ]; then',
        *(f"  {line}" for line in one_node),
        f'  exec "$PYTHON" -m torch.distributed.run --nnodes 1 --nproc-per-node {cfg.nprocs} '
        '--rdzv-backend c10d --rdzv-endpoint "${endpoint:-127.0.0.1:0}" ${flags[@]+"${flags[@]}"} '
        '"$here/train_tuned.py" "$@"',
        "fi",
        *nodes.interface_lines(TORCHRUN_NAME, cuda=cfg.device == "cuda"),
        f'exec {nodes.torchrun_command(nprocs=cfg.nprocs, restarts=False)} ${{flags[@]+"${{flags[@]}}"}} '
        '"$here/train_tuned.py" "$@"',
    ]
    return "\n".join(lines) + "\n"


def _checkpoint_code(blocks: tuple[str, ...]) -> list[str]:
    return ["from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (",
            "    CheckpointImpl, apply_activation_checkpointing, checkpoint_wrapper)",
            "import functools",
            _checkpoint_line(blocks).split("  # from")[0] + "  # recompute each block's activations in backward"]


def _shard_code(cfg: TrialConfig, blocks: tuple[str, ...], *, mesh: str = "") -> list[str]:
    """fully_shard over each block, then the whole model; ``mesh``: the argument naming the
    ranks' mesh where a tool holds one (Lightning's ``self.device_mesh``)."""
    classes = ", ".join(blocks) if blocks else "YourBlock"
    raf = f"{mesh}reshard_after_forward={cfg.sharding == Sharding.FULL}"
    return ["from torch.distributed.fsdp import fully_shard  # instead of DistributedDataParallel",
            f"for block in [m for m in model.modules() if isinstance(m, ({classes},))]:",
            f"    fully_shard(block, {raf})  # each block its own unit",
            f"fully_shard(model, {raf})  # then the rest"]


def _memory_lines(cfg: TrialConfig, blocks: tuple[str, ...]) -> list[str]:
    """Checkpointing and sharding, in PyTorch's order: checkpoint the blocks, shard each
    block, then the whole model, and build the optimizer after (it takes the shards)."""
    code = _checkpoint_code(blocks) if cfg.activation_checkpointing else []
    if _sharded(cfg):
        code += _shard_code(cfg, blocks)
        code.append("optimizer = torch.optim.AdamW(model.parameters())  # your optimizer, built after "
                    "fully_shard: it takes the shards (DTensors)")
        code.append("# checkpoints: torch.distributed.checkpoint.state_dict.get_model_state_dict(model, "
                    "options=StateDictOptions(full_state_dict=True, cpu_offload=True)) on every rank")
    return code


def _accumulation_lines(cfg: TrialConfig) -> list[str]:
    """The loop of gradient accumulation: the ranks synchronise on the last micro-batch only."""
    n = cfg.grad_accum
    lines = [f"# gradient accumulation: {n} loader batches of {cfg.micro_batch} per optimizer step",
             "for i, (inputs, targets) in enumerate(loader):",
             f"    last = (i + 1) % {n} == 0"]
    if _sharded(cfg):
        lines.append("    model.set_requires_gradient_sync(last)  # reduce-scatter on the last only")
        body = "    "
    elif cfg.nprocs > 1:
        lines.append("    with contextlib.nullcontext() if last else model.no_sync():  # all-reduce on the last only")
        body = "        "
    else:
        body = "    "
    lines += [f"{body}loss = loss_fn(model(inputs), targets) / {n}  # the mean over the {n}",
              f"{body}loss.backward()",
              "    if last:",
              "        optimizer.step()",
              "        optimizer.zero_grad()"]
    return lines


def render_snippet(cfg: TrialConfig, baseline: TrialConfig, env: Mapping[str, str], *,
                   blocks: tuple[str, ...] = ()) -> str:
    """The lines that differ from the user's baseline, for a hand-written loop; ``blocks``:
    the model's repeated block classes, which the memory knobs act on."""
    code: list[str] = []
    shell: list[str] = gpu_stacks.snippet_shell(cfg, baseline, env)
    cuda = cfg.device == "cuda"
    several = cfg.nprocs > 1
    becomes_ddp = several and baseline.nprocs == 1
    if cfg.threads != baseline.threads and cfg.threads:
        code.append(f"torch.set_num_threads({cfg.threads})  # per process; or OMP_NUM_THREADS={cfg.threads}")
    if cfg.interop_threads != baseline.interop_threads and cfg.interop_threads:
        code.append(f"torch.set_num_interop_threads({cfg.interop_threads})  # before any parallel work")
    if cfg.cudnn_benchmark and not baseline.cudnn_benchmark:
        code.append(f"{CUDNN_BENCHMARK_LINE}  # cuDNN times its algorithms per input shape, keeps the fastest")
    if becomes_ddp:
        code.append(f'torch.distributed.init_process_group("{cfg.backend}")  # under torchrun.sh: '
                    f"{cfg.nprocs} ranks")
        if cuda:
            # Without it every rank would use cuda:0, which NCCL refuses ("Duplicate GPU detected").
            code.append('local_rank = int(os.environ["LOCAL_RANK"])  # set by torchrun')
            code.append("torch.cuda.set_device(local_rank)  # before any CUDA work: one GPU per rank")
    loader_changed = {k: v for k, v in loader_kwargs(cfg).items() if loader_kwargs(baseline).get(k) != v}
    pinned = bool(loader_kwargs(cfg)["pin_memory"])
    new_loader = bool(loader_changed) or cfg.nprocs != baseline.nprocs
    if new_loader:
        if several:
            # DataLoader refuses shuffle=True beside a sampler: the sampler shuffles.
            code.append("sampler = torch.utils.data.distributed.DistributedSampler(dataset, shuffle=True)"
                        "  # each rank reads its share")
            code.append(f"loader = torch.utils.data.DataLoader(dataset, sampler=sampler, shuffle=False, "
                        f"{_loader_kwargs_text(cfg)})")
            code.append("# a stream (an IterableDataset) takes no sampler: it shards itself by rank, "
                        "see IterableShard in train_tuned.py")
        else:
            code.append(f"loader = torch.utils.data.DataLoader(dataset, shuffle=True, {_loader_kwargs_text(cfg)})")
    if cfg.channels_last and not baseline.channels_last:
        code.append("model = model.to(memory_format=torch.channels_last)")
        code.append("# and each image batch: inputs = inputs.to(memory_format=torch.channels_last)")
    if becomes_ddp and cuda:
        code.append("model = model.to(local_rank)")
    code += gpu_stacks.model_code(cfg, baseline, becomes_ddp=becomes_ddp)
    if (cfg.activation_checkpointing, cfg.sharding) != (baseline.activation_checkpointing, baseline.sharding):
        code += _memory_lines(cfg, blocks)
    if becomes_ddp and not _sharded(cfg):
        code.append(gpu_stacks.ddp_call(cfg, "device_ids=[local_rank]" if cuda else ""))
    mode = cfg.compile if cfg.compile != CompileMode.OFF else None
    if mode and mode != baseline.compile:
        code.append(f'model = torch.compile(model, mode="{mode}")' if mode != CompileMode.DEFAULT
                    else "model = torch.compile(model)")
    if cfg.precision != baseline.precision:
        if cfg.precision in (Precision.BF16, Precision.FP16):
            dtype = "bfloat16" if cfg.precision == Precision.BF16 else "float16"
            device = "cuda" if cuda else "cpu"
            code.append(f'with torch.autocast("{device}", dtype=torch.{dtype}):  # the forward pass and the loss')
            code.append("    loss = loss_fn(model(inputs), targets)")
            if cfg.precision == Precision.FP16:
                code.append('scaler = torch.amp.GradScaler("cuda")  # scaler.scale(loss).backward(); '
                            "scaler.step(optimizer); scaler.update()")
                code.append("# with gradient clipping: scaler.unscale_(optimizer) first, then "
                            "torch.nn.utils.clip_grad_norm_(...), then scaler.step(optimizer)")
        elif cfg.precision == Precision.TF32:
            code.append(f"{TF32_LINES[0]}  # TF32 matrix products; cuDNN convolutions use TF32 by default")
            code.append(f"{TF32_LINES[1]}  # the legacy flag, in step: torch.compile still reads it")
    if new_loader and (several or (pinned and "pin_memory" in loader_changed)):
        code += _loop_lines(several=several, pinned=pinned, ddp_on_cuda=becomes_ddp and cuda)
    if cfg.grad_accum != baseline.grad_accum and cfg.grad_accum > 1:
        code += _accumulation_lines(cfg)
    code += optimizer.step_code(cfg)
    if cfg.lr_factor != 1.0:
        code.append("for group in optimizer.param_groups:  # --scale-lr "
                    f"{cfg.lr_scaling}: the global batch {cfg.batch_size} over your {cfg.lr_batch}")
        code.append(f"    group['lr'] *= {cfg.lr_factor:g}")
    if cfg.allocator != baseline.allocator and "LD_PRELOAD" in env:
        shell.append(f"export LD_PRELOAD={shlex.quote(env['LD_PRELOAD'])}  # the {cfg.allocator} allocator")
        if "MALLOC_CONF" in env:
            shell.append(f"export MALLOC_CONF={shlex.quote(env['MALLOC_CONF'])}")
    if cfg.threads != baseline.threads and cfg.threads:
        shell.append(f"export OMP_NUM_THREADS={cfg.threads}")
    out = ["# Apply the tuned configuration to your own training loop", "",
           f"Only the lines that differ from your configuration ({baseline.short()}) are here; "
           f"autotune measured {cfg.short()}.", ""]
    if not code and not shell:
        return "\n".join(out + ["Nothing differs: your configuration is the fastest one verified.", ""])
    if shell:
        out += ["Before starting Python:", "", "```bash", *shell, "```", ""]
    if code:
        imports = ["import os"] if any("os.environ" in line for line in code) else []
        imports += ["import contextlib"] if any("contextlib." in line for line in code) else []
        out += ["In the script:", "", "```python", *imports, "import torch", "", *code, "```", ""]
    if cfg.prune_ratio:
        out += [f"Structured pruning ({cfg.prune_ratio:g} of channels) changes the model: train_tuned.py "
                "applies it (prune_model); copy that function to use it.", ""]
    return "\n".join(out)


def _loop_lines(*, several: bool, pinned: bool, ddp_on_cuda: bool) -> list[str]:
    """The training loop's own lines: the sampler's epoch, and the copies pinned memory
    makes asynchronous (pin_memory=True gains nothing with blocking copies)."""
    lines = []
    if pinned:
        lines.append("device = torch.device(\"cuda\", local_rank)" if ddp_on_cuda
                     else "device = torch.device(\"cuda\")")
    lines.append("for epoch in range(epochs):")
    if several:
        lines.append("    sampler.set_epoch(epoch)  # a new order each epoch, the same on every rank")
    lines.append("    for inputs, targets in loader:")
    if pinned:
        lines.append("        inputs = inputs.to(device, non_blocking=True)  # from pinned memory: "
                     "the copy overlaps the GPU's work")
        lines.append("        targets = targets.to(device, non_blocking=True)")
    lines.append("        ...  # your step")
    return lines


def write_stack_files(out_dir: Path, *, cfg: TrialConfig, baseline: TrialConfig,
                      env: Mapping[str, str], default_threads: int | None = None,
                      blocks: tuple[str, ...] = ()) -> dict[str, str]:
    """Write the stack files (and sbatch.sh, see emit.slurm) into ``out_dir``; returns their
    names (relative to it).

    A configuration that leaves the threads to PyTorch ran with ``default_threads``, the
    count PyTorch chose on this machine; the files name it, because the other launchers
    choose their own where none is given (accelerate launch all physical cores, whatever
    the affinity mask; torchrun one per rank). ``blocks``: the model's repeated block classes
    (``Task.blocks``), which the memory knobs' settings name."""
    if default_threads:
        cfg, baseline = (c if c.threads else c.replace(threads=default_threads) for c in (cfg, baseline))
        env = {"OMP_NUM_THREADS": str(default_threads), **env}
    write_atomically(out_dir / ACCELERATE_NAME, render_accelerate(cfg, baseline, env, blocks=blocks))
    write_atomically(out_dir / LIGHTNING_NAME,
                     json.dumps(lightning_arguments(cfg, baseline, env, blocks=blocks), indent=2) + "\n")
    write_atomically(out_dir / TORCHRUN_NAME, render_torchrun(cfg, env), mode=0o755)
    write_atomically(out_dir / SNIPPET_NAME, render_snippet(cfg, baseline, env, blocks=blocks))
    write_atomically(out_dir / slurm.SBATCH_NAME, slurm.render_sbatch(cfg, env), mode=0o755)
    return {"accelerate": ACCELERATE_NAME, "lightning": LIGHTNING_NAME, "torchrun": TORCHRUN_NAME,
            "snippet": SNIPPET_NAME, "slurm": slurm.SBATCH_NAME}
