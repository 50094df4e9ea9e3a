"""The model as trained: the user's model with the in-process knobs applied, and one
optimizer step on it."""
from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from . import gpu_knobs, memory_knobs
from .data import move
from .distributed import Distributed
from .knobs import CompileMode, ConfigDict, Device, LrScaling, Precision, Sharding, lr_factor
from .optimizer_step import step_applies, with_step


class NonFiniteLoss(RuntimeError):
    """The loss became NaN or infinite."""


def unwrap_model(model: torch.nn.Module) -> torch.nn.Module:
    """The user's own model inside the wrappers build_model adds: torch.compile's
    OptimizedModule (its ``_orig_mod``) and DistributedDataParallel (its ``.module``).
    Its state_dict has the user's parameter names, without the wrappers' prefixes, and
    calling it runs no DDP gradient synchronisation. A sharded model is its own (FSDP2
    shards in place): its parameters are this rank's shares, and calling it gathers them,
    a collective (see memory_knobs.gathered for the user's evaluate())."""
    model = getattr(model, "_orig_mod", model)
    if isinstance(model, (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)):
        model = model.module
    return model


def call_model(model: torch.nn.Module, inputs: Any) -> Any:
    """Call the model on a batch's inputs: a dict as keyword arguments, a list or tuple
    as positional arguments, anything else as the one argument."""
    if isinstance(inputs, dict):
        return model(**inputs)
    if isinstance(inputs, (list, tuple)):
        return model(*inputs)
    return model(inputs)


def prune_model(model: torch.nn.Module, ratio: float, example_inputs: Any) -> None:
    """Remove channels physically with Torch-Pruning; the output layer is kept."""
    import torch_pruning as tp

    ignored = []
    for module in reversed(list(model.modules())):
        if isinstance(module, (torch.nn.Linear, torch.nn.Conv2d, torch.nn.Conv1d)):
            ignored.append(module)  # the last layer maps to the task's outputs
            break
    pruner = tp.pruner.BasePruner(
        model,
        example_inputs,
        importance=tp.importance.GroupMagnitudeImportance(p=2),
        pruning_ratio=ratio,
        ignored_layers=ignored,
    )
    with torch.enable_grad():
        pruner.step()


def sync_batchnorm(model: torch.nn.Module, device: torch.device, world: int) -> torch.nn.Module:
    """BatchNorm layers as SyncBatchNorm on several CUDA ranks: their statistics then cover
    the global batch, as in one process, so a layout of several GPUs trains the same model
    as one. SyncBatchNorm runs on CUDA only: elsewhere the model is left as it is."""
    if device.type != Device.CUDA or world <= 1:
        return model
    return torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)


def config_lr_factor(cfg: ConfigDict, *, nodes: int = 1) -> float:
    """The configuration's learning-rate factor (``lr_scaling``) at its global batch: its
    ``batch_size`` on each of ``nodes`` (it was tuned on one; a job of several nodes
    runs its layout on each)."""
    batch = int(cfg.get("batch_size") or 1) * nodes
    return lr_factor(str(cfg.get("lr_scaling", LrScaling.NONE)), batch=batch, lr_batch=cfg.get("lr_batch"))


def scale_lr(optimizer: Any, factor: float) -> None:
    """Every parameter group's learning rate times ``factor``. A tensor learning rate
    (``lr=torch.tensor(...)``, for a compiled or capturable optimizer) is multiplied in
    place: it stays a tensor, and the one the optimizer holds; one shared by several
    groups is multiplied once."""
    if factor == 1.0:
        return
    scaled: set[int] = set()
    for group in optimizer.param_groups:
        lr = group["lr"]
        if isinstance(lr, torch.Tensor):
            if id(lr) not in scaled:
                scaled.add(id(lr))
                with torch.no_grad():
                    lr.mul_(factor)
        else:
            group["lr"] = lr * factor


def first_lr(optimizer: Any) -> float | None:
    """The first parameter group's learning rate, as a number."""
    groups = getattr(optimizer, "param_groups", None) or [{}]
    lr = groups[0].get("lr")
    return float(lr) if lr is not None else None


class BuiltModel(NamedTuple):
    """What build_model makes: the model as trained, its optimizer, and for a sharded model
    the plain model's structure without weights (memory_knobs.skeleton), which the user's
    evaluate() gets with the gathered weights (memory_knobs.gathered); None otherwise."""

    model: Any
    optimizer: Any
    plain: torch.nn.Module | None


def build_model(user: Any, cfg: ConfigDict, dist: Distributed, example_batch: Any) -> BuiltModel:
    """Model and optimizer with every in-process knob applied, in the order that works:
    prune, then memory format, SyncBatchNorm and device, then float8 (torchao), then
    activation checkpointing; then optimizer (with its step, ``optimizer_step``), IPEX, DDP
    and compile, or with sharding over several ranks (PyTorch's order for FSDP2): each
    repeated block compiled in place, fully_shard, and the optimizer last, over the sharded
    parameters. The optimizer's learning rates are scaled as ``lr_scaling`` says
    (config_lr_factor), here alone: trials, verification and train_tuned.py all build
    through this."""
    model = user.build_model()
    prune_ratio = float(cfg.get("prune_ratio") or 0.0)
    if prune_ratio > 0:
        inputs = example_batch[0] if isinstance(example_batch, (list, tuple)) else example_batch
        prune_model(model, prune_ratio, inputs)
    if cfg.get("channels_last"):
        model = model.to(memory_format=torch.channels_last)
    model = sync_batchnorm(model, dist.device, dist.world)
    model = model.to(dist.device)
    model.train()
    sharding = str(cfg.get("sharding", Sharding.OFF))
    sharded = dist.enabled and sharding != Sharding.OFF
    plain = memory_knobs.skeleton(model) if sharded else None
    if cfg.get("float8"):  # on the device, before checkpointing, sharding, DDP and compile wrap it
        gpu_knobs.convert_to_float8(model)
    if cfg.get("activation_checkpointing"):
        memory_knobs.checkpoint_activations(model)
    mode = str(cfg.get("compile", CompileMode.OFF))
    compile_mode = None if mode == CompileMode.DEFAULT else mode
    make_optimizer = getattr(user, "build_optimizer", None)
    step = step_applies(cfg, sharded=sharded)

    def optimizer_of(params: Any) -> torch.optim.Optimizer:
        optimizer = make_optimizer(params) if make_optimizer else torch.optim.AdamW(params, lr=1e-3)
        # the step implementation first: the rebuilt optimizer is the one whose lr is scaled
        optimizer = with_step(optimizer, step)
        # here, before IPEX (which may hand back an optimizer of its own made from this one)
        scale_lr(optimizer, config_lr_factor(cfg, nodes=dist.nodes))
        return optimizer

    if sharded:
        if mode != CompileMode.OFF:
            # Block by block, in place (the names stay the user's): FSDP2's hooks around
            # each block stay outside the compiled code.
            for block in memory_knobs.repeated_blocks(model):
                block.compile(mode=compile_mode)
        memory_knobs.shard(model, dist, reshard_after_forward=sharding == Sharding.FULL)
        return BuiltModel(model, optimizer_of(model.parameters()), plain)
    optimizer = optimizer_of(model.parameters())
    if cfg.get("ipex"):
        import intel_extension_for_pytorch as ipex

        dtype = torch.bfloat16 if cfg.get("precision") == Precision.BF16 else None
        model, optimizer = ipex.optimize(model, optimizer=optimizer, dtype=dtype)
    if dist.enabled:
        ids = [dist.device.index] if dist.device.type == Device.CUDA else None
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=ids, **gpu_knobs.ddp_options(cfg))
    if mode != CompileMode.OFF:
        model = torch.compile(model, mode=compile_mode)
    return BuiltModel(model, optimizer, plain)


def autocast(cfg: ConfigDict, device: torch.device) -> contextlib.AbstractContextManager:
    """The autocast context of the configuration's precision (none for fp32 and tf32)."""
    precision = cfg.get("precision", Precision.FP32)
    if precision == Precision.BF16:
        return torch.autocast(device.type, dtype=torch.bfloat16)
    if precision == Precision.FP16:
        return torch.autocast(device.type, dtype=torch.float16)
    return contextlib.nullcontext()


def make_scaler(cfg: ConfigDict, device: torch.device) -> torch.amp.GradScaler | None:
    """fp16 needs its loss scaled; the other precisions do not."""
    return torch.amp.GradScaler(device.type) if cfg.get("precision") == Precision.FP16 else None


def user_loss(user: Any, model: Any, batch: Any, *, cfg: ConfigDict, device: torch.device) -> torch.Tensor:
    """The loss of one (micro-)batch already on ``device``, under the configuration's
    autocast: the user's training_step(model, batch), else loss_fn (cross-entropy by
    default) of the model's output and the targets."""
    with autocast(cfg, device):
        training_step = getattr(user, "training_step", None)
        if training_step is not None:
            return training_step(model, batch)
        loss_fn = getattr(user, "loss_fn", None) or torch.nn.functional.cross_entropy
        inputs, targets = batch
        return loss_fn(call_model(model, inputs), targets)


def make_step(user: Any, model: Any, optimizer: Any, cfg: ConfigDict, device: torch.device, *,
              scaler: torch.amp.GradScaler | None = None) -> Callable[[Any], torch.Tensor]:
    """A function doing one optimizer step on one batch (moved to ``device``); it returns
    the loss as a detached tensor so the caller decides when to synchronise with the device.

    The callers keep losses across steps and read them later (a window's, a log
    interval's). So the loss returned is a copy: under compile=reduce-overhead a loss
    computed inside the compiled model (``training_step = model(**batch).loss``) is an
    output of a CUDA graph, whose memory the next replay overwrites, and reading it then
    raises. Each step also tells the CUDA graph trees that a new iteration begins.

    With ``grad_accum`` above 1 the batch is split into that many micro-batches along dim
    0 (memory_knobs.micro_batches; the user's training_step gets each), their gradients add up
    before the one optimizer step, and the loss returned is the micro-losses' mean: the
    batch's loss, for a mean-reduced loss."""
    channels_last = bool(cfg.get("channels_last"))
    graphs = cfg.get("compile") == CompileMode.REDUCE_OVERHEAD

    accumulate = int(cfg.get("grad_accum") or 1)

    def forward_loss(batch: Any) -> torch.Tensor:
        return user_loss(user, model, batch, cfg=cfg, device=device)

    def backward(loss: torch.Tensor) -> None:
        if scaler is not None:
            scaler.scale(loss).backward()
        else:
            loss.backward()

    def step(batch: Any) -> torch.Tensor:
        if graphs:
            torch.compiler.cudagraph_mark_step_begin()
        batch = move(batch, device, channels_last=channels_last)
        optimizer.zero_grad(set_to_none=True)
        if accumulate == 1:
            loss = forward_loss(batch)
            backward(loss)
            total = loss.detach().clone()
        else:
            # Each micro-batch's loss over grad_accum: the gradients add up to the mean-
            # reduced loss's over the whole batch; the ranks synchronise on the last only.
            parts = memory_knobs.micro_batches(batch, accumulate)
            micro_losses = []
            for i, part in enumerate(parts):
                if graphs and i:
                    torch.compiler.cudagraph_mark_step_begin()
                with memory_knobs.gradient_sync(model, on=i == accumulate - 1):
                    loss = forward_loss(part) / accumulate
                    backward(loss)
                micro_losses.append(loss.detach())
            total = torch.stack(micro_losses).sum()
        if scaler is not None:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        return total

    return step


def check_finite(losses: list[torch.Tensor]) -> list[float]:
    """The losses as floats (this synchronises with the device, once: a float() per
    loss would wait for the device once per loss); raises NonFiniteLoss at the first NaN
    or infinite one."""
    if not losses:
        return []
    values = [float(v) for v in torch.stack([v.reshape(()) for v in losses]).tolist()]
    for i, v in enumerate(values):
        if not math.isfinite(v):
            raise NonFiniteLoss(f"loss became {v} at step {i} of the window")
    return values


