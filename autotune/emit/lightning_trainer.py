"""lightning_trainer.json: the arguments of Lightning's ``Trainer``, the strategy to build
(an object JSON cannot hold), the DataLoader's arguments and the environment."""
from __future__ import annotations

from collections.abc import Mapping

from autotune.config import TrialConfig
from autotune.emit import gpu_stacks
from autotune.emit.gpu_stacks import Tool
from autotune.emit.stack_knobs import (
    checkpoint_code,
    compile_mode,
    loader_kwargs,
    not_expressible,
    process_environment,
    shard_code,
    sharded,
)
from autotune.runtime.json_value import JsonObject
from autotune.runtime.knobs import CompileMode, Device, Precision, Sharding

LIGHTNING_NAME = "lightning_trainer.json"

_LIGHTNING_PRECISION: dict[str, str] = {
    Precision.FP32: "32-true", Precision.TF32: "32-true", Precision.BF16: "bf16-mixed", Precision.FP16: "16-mixed"}


def _lightning_strategy(cfg: TrialConfig, blocks: tuple[str, ...]) -> JsonObject | None:
    """The strategy object's class and arguments: DDP, or with sharding FSDP over the block
    classes (Lightning's FSDPStrategy is FSDP1: its SHARD_GRAD_OP is grad-op's counterpart).
    FSDPStrategy refuses a CPU ("requires a GPU accelerator"): there ModelParallelStrategy
    runs FSDP2 over gloo, applied by the lines it gives for ``configure_model()``. Every key
    but class, note and configure_model is the constructor's keyword argument."""
    if cfg.nprocs == 1:
        return None
    if not sharded(cfg):
        return {"class": "lightning.pytorch.strategies.DDPStrategy", "process_group_backend": cfg.backend,
                **gpu_stacks.ddp_kwargs(cfg), "note": "Trainer(strategy=DDPStrategy(process_group_backend=..., "
                "...)) to keep the tuned backend; the string \"ddp\" picks gloo on CPU and nccl on GPUs"}
    classes = list(blocks) or ["YourBlock"]
    if cfg.device == Device.CPU:
        code = ["model = self.model  # the network your LightningModule holds"]
        code += checkpoint_code(blocks) if cfg.activation_checkpointing else []
        code += shard_code(cfg, blocks, mesh='mesh=self.device_mesh["data_parallel"], ')
        return {"class": "lightning.pytorch.strategies.ModelParallelStrategy",
                "data_parallel_size": cfg.nprocs, "tensor_parallel_size": 1,
                "process_group_backend": cfg.backend, "save_distributed_checkpoint": False,
                "configure_model": code,
                "note": "Lightning's FSDPStrategy refuses accelerator=\"cpu\" (it requires a GPU): on CPU "
                        "ModelParallelStrategy runs FSDP2; put the configure_model lines in your "
                        "LightningModule's configure_model(), and build the optimizer in "
                        "configure_optimizers() from self.parameters() (the shards)"}
    strategy: JsonObject = {
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
    if not sharded(cfg):
        return "ddp"
    return "fsdp" if cfg.device == Device.CUDA else "ModelParallelStrategy"


def lightning_arguments(cfg: TrialConfig, baseline: TrialConfig, env: Mapping[str, str], *,
                        blocks: tuple[str, ...] = ()) -> JsonObject:
    """``Trainer(**doc["trainer"])`` with the strategy built as ``doc["strategy"]`` says (an
    object JSON cannot hold), the DataLoader's arguments and the environment. ``blocks``:
    the model's repeated block classes, which sharding wraps and checkpointing recomputes."""
    trainer: JsonObject = {"accelerator": "gpu" if cfg.device == Device.CUDA else "cpu", "devices": cfg.nprocs,
                               "num_nodes": 1, "precision": _LIGHTNING_PRECISION[cfg.precision],
                               "strategy": _lightning_strategy_name(cfg)}
    if cfg.cudnn_benchmark:
        trainer["benchmark"] = True
    if cfg.grad_accum > 1:
        trainer["accumulate_grad_batches"] = cfg.grad_accum
    doc: JsonObject = {
        "trainer": trainer,
        "strategy": _lightning_strategy(cfg, blocks),
        "dataloader": loader_kwargs(cfg),
        "environment": process_environment(env, for_train_tuned=False),
        "compile": ({"mode": compile_mode(cfg), "how": "model = torch.compile(model, mode=...) in "
                                                        "configure_model() or before fit()"}
                    if cfg.compile != CompileMode.OFF else None),
        "not_expressible": not_expressible(cfg, baseline, tool=Tool.LIGHTNING, blocks=blocks),
        "several_nodes": {
            "num_nodes": "N nodes: Trainer(num_nodes=N) on every node; devices stays the tuned count per node",
            "launch": (f"on each node: torchrun --nnodes N --node-rank R --nproc-per-node {cfg.nprocs} "
                       "--rdzv-backend c10d --rdzv-endpoint HOST:PORT your_script.py (HOST: node 0's address; "
                       "Lightning reads torchrun's environment), or under Slurm srun with "
                       f"--ntasks-per-node={cfg.nprocs}"),
            "dataloader": (f"batch_size stays {loader_kwargs(cfg)['batch_size']} per process: the global "
                           f"batch becomes N x {cfg.batch_size}, so mind the learning rate"),
            "environment": ("GLOO_SOCKET_IFNAME" + (" and NCCL_SOCKET_IFNAME" if cfg.device == Device.CUDA else "")
                            + " must name the interface the nodes share, not lo"),
        },
    }
    return doc
