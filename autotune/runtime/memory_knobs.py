"""The memory knobs: which blocks of a model they act on, activation checkpointing,
sharding over ranks (FSDP2) and the micro-batches of gradient accumulation.

One policy, ``repeated_blocks``, picks what is checkpointed and what is sharded: the
modules whose class occurs at least twice and holds modules of its own (a transformer's
layers, a user's ``Block``), outermost only. Checkpointing a block recomputes its
activations in the backward pass; sharding a block gathers its weights for its forward
and backward alone, so what a rank holds at once is its share plus one block.
"""
from __future__ import annotations

import collections
import contextlib
import copy
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch

from .distributed import Distributed

if TYPE_CHECKING:
    from torch.distributed.checkpoint.state_dict import ValueType  # what torch's full state dict holds

# What activation checkpointing's wrapper inserts into parameter names; its state_dict
# hooks take it out again, so a checkpoint holds the user's names.
CHECKPOINT_PREFIX = "_checkpoint_wrapped_module."


def _runs_forward(module: torch.nn.Module) -> bool:
    """ModuleList and ModuleDict hold blocks but have no forward of their own: neither
    checkpointing nor sharding can wrap a call to them."""
    return type(module).forward is not torch.nn.Module.forward


def repeated_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's repeated blocks, in model order: modules (not the model itself) with
    children of their own whose class occurs at least twice, and outermost only: a block
    inside another block is part of it. A module holding others of its own class (an
    ``nn.Sequential`` of blocks that hold an ``nn.Sequential`` MLP each) is their container,
    not a block."""
    named = [(name, m) for name, m in list(model.named_modules())[1:]
             if _runs_forward(m) and any(True for _ in m.children())]
    blocks = [(name, m) for name, m in named
              if not any(type(inner) is type(m) for inner in list(m.modules())[1:])]
    counts = collections.Counter(type(m) for _, m in blocks)
    chosen: list[tuple[str, torch.nn.Module]] = []
    for name, module in blocks:
        if counts[type(module)] < 2 or any(name.startswith(outer + ".") for outer, _ in chosen):
            continue
        chosen.append((name, module))
    return [m for _, m in chosen]


def block_names(model: torch.nn.Module) -> tuple[str, ...]:
    """The class names of the model's repeated blocks (see repeated_blocks), in order."""
    return tuple(dict.fromkeys(type(m).__name__ for m in repeated_blocks(model)))


def require_blocks(model: torch.nn.Module, knob: str) -> list[torch.nn.Module]:
    """The repeated blocks a knob acts on, or a clear error when the model has none."""
    blocks = repeated_blocks(model)
    if not blocks:
        raise ValueError(
            f"{knob}: the model {type(model).__name__} has no repeated blocks (a module class with "
            "modules of its own that occurs at least twice, such as a transformer's layers), and "
            f"{knob} acts on those: set {knob} off for this model, or build it from repeated blocks")
    return blocks


def checkpoint_activations(model: torch.nn.Module) -> int:
    """Wrap each repeated block in PyTorch's activation checkpointing (non-reentrant: it
    restores the RNG state for the recomputation, so dropout draws what it drew, and the
    gradients are those of the plain model). Returns the number of blocks wrapped."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointImpl,
        apply_activation_checkpointing,
        checkpoint_wrapper,
    )

    blocks = {id(m) for m in require_blocks(model, "activation_checkpointing")}

    def wrapper(module: torch.nn.Module) -> torch.nn.Module:
        return checkpoint_wrapper(module, checkpoint_impl=CheckpointImpl.NO_REENTRANT)

    apply_activation_checkpointing(model, checkpoint_wrapper_fn=wrapper, check_fn=lambda m: id(m) in blocks)
    return len(blocks)


def inner_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated blocks as the user wrote them, inside checkpointing's wrappers."""
    return [getattr(b, "_checkpoint_wrapped_module", b) for b in repeated_blocks(model)]


def checkpointed_blocks(model: torch.nn.Module) -> int:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

    return sum(isinstance(m, CheckpointWrapper) for m in model.modules())


def skeleton(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of the model's structure whose parameters and persistent buffers are on the
    meta device (they cost no memory): the plain model a sharded one's gathered weights
    are loaded into for the user's evaluate(). Non-persistent buffers are not in a state
    dict, so they are copied as they are."""
    memo: dict[int, Any] = {}
    for module in model.modules():
        for p in module.parameters(recurse=False):
            memo[id(p)] = torch.nn.Parameter(torch.empty_like(p, device="meta"), requires_grad=p.requires_grad)
        for name, b in module.named_buffers(recurse=False):
            if name not in module._non_persistent_buffers_set:
                memo[id(b)] = torch.empty_like(b, device="meta")
    return copy.deepcopy(model, memo)


def shard(model: torch.nn.Module, dist: Distributed, *, reshard_after_forward: bool) -> int:
    """Shard the model over the ranks with FSDP2: each repeated block its own unit, then
    the root for the rest (PyTorch's documented order, innermost first). Parameters become
    DTensors holding this rank's share: the optimizer must be built after. Returns the
    number of blocks sharded on their own."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    blocks = require_blocks(model, "sharding")
    mesh = init_device_mesh(dist.device.type, (dist.world,))
    for block in blocks:
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward)
    return len(blocks)


def is_sharded(model: torch.nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def local_share(model: torch.nn.Module) -> tuple[int, int]:
    """(elements this rank holds, elements of the model) over the parameters."""
    from torch.distributed.tensor import DTensor

    held = total = 0
    for p in model.parameters():
        total += p.numel()
        held += p.to_local().numel() if isinstance(p, DTensor) else p.numel()
    return held, total


def user_names(model: torch.nn.Module) -> dict[int, str]:
    """Each parameter's name as in the user's model (without the wrappers' prefixes), by id."""
    return {id(p): name.replace(CHECKPOINT_PREFIX, "").replace("_orig_mod.", "")
            for name, p in model.named_parameters()}


def _full_options(*, cpu_offload: bool) -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, cpu_offload=cpu_offload)


def full_model_state(model: torch.nn.Module) -> dict[str, ValueType]:
    """The sharded model's whole state dict under the user's names, gathered onto the host;
    collective: every rank calls it, rank 0 receives it (the others an empty dict)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    return get_model_state_dict(model, options=_full_options(cpu_offload=True))


def full_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The sharded optimizer's whole state in torch's own format (parameters numbered in
    the order of its groups), as a plain optimizer of the plain model saves it; collective
    as full_model_state."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    by_name: dict[str, Any] = dict(get_optimizer_state_dict(model, optimizer, options=_full_options(cpu_offload=True)))
    if not by_name:
        return by_name
    order = {name: i for i, name in enumerate(n for g in by_name["param_groups"] for n in g["params"])}
    return {"state": {order[name]: s for name, s in by_name["state"].items()},
            "param_groups": [{**g, "params": [order[n] for n in g["params"]]} for g in by_name["param_groups"]]}


def load_full_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, *,
                    model_state: dict[str, ValueType], optimizer_state: dict[str, Any]) -> None:
    """Load a whole (unsharded) model and optimizer state, as full_model_state and
    full_optimizer_state give them, into the sharded model: every rank keeps its share."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

    options = _full_options(cpu_offload=False)
    set_model_state_dict(model, model_state, options=options)
    names = user_names(model)
    order = [names[id(p)] for g in optimizer.param_groups for p in g["params"]]
    by_name = {"state": {order[i]: s for i, s in optimizer_state["state"].items()},
               "param_groups": [{**g, "params": [order[i] for i in g["params"]]}
                                for g in optimizer_state["param_groups"]]}
    set_optimizer_state_dict(model, optimizer, by_name, options=options)  # type: ignore[arg-type]


@contextlib.contextmanager
def gathered(model: torch.nn.Module, plain: torch.nn.Module | None, dist: Distributed) -> Iterator[
        torch.nn.Module | None]:
    """The model as the user's evaluate() takes it, on rank 0: a sharded model's weights
    gathered (collective: every rank enters) into a plain copy on the training device,
    which is freed after; an unsharded one as it is. The other ranks get None."""
    if plain is None or not is_sharded(model):
        yield model if dist.rank == 0 else None
        return
    state = full_model_state(model)
    if dist.rank != 0:
        yield None
        return
    copy_ = copy.deepcopy(plain)
    copy_.load_state_dict(state, assign=True)
    copy_.to(dist.device)
    try:
        yield copy_
    finally:
        del copy_, state


def micro_batches(batch: Any, n: int) -> list[Any]:
    """``batch`` as ``n`` micro-batches along dim 0: each tensor split into n equal slices
    (views); dicts, lists and tuples split element-wise; anything else (a flag, a scalar
    tensor) goes whole into each micro-batch."""
    if n == 1:
        return [batch]
    if isinstance(batch, torch.Tensor):
        if batch.dim() == 0:
            return [batch] * n
        if batch.shape[0] % n:
            raise ValueError(
                f"grad_accum={n}: a batch tensor of shape {tuple(batch.shape)} does not split into {n} "
                f"equal micro-batches along dim 0: make each rank's batch a multiple of {n} "
                "(batch_size a multiple of nprocs x grad_accum) or use another grad_accum")
        return list(torch.split(batch, batch.shape[0] // n))
    if isinstance(batch, dict):
        parts = {k: micro_batches(v, n) for k, v in batch.items()}
        return [type(batch)({k: v[i] for k, v in parts.items()}) for i in range(n)]
    if isinstance(batch, (list, tuple)):
        columns = [micro_batches(v, n) for v in batch]
        rows = [[c[i] for c in columns] for i in range(n)]
        if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a namedtuple
            return [type(batch)(*r) for r in rows]
        return [type(batch)(r) for r in rows]
    return [batch] * n


@contextlib.contextmanager
def gradient_sync(model: Any, *, on: bool) -> Iterator[None]:
    """Whether a backward pass inside synchronises gradients over the ranks: off for the
    micro-batches before an accumulation's last (DDP's no_sync, FSDP2's
    set_requires_gradient_sync); a single process has nothing to synchronise."""
    inner = getattr(model, "_orig_mod", model)
    if on:
        if is_sharded(inner):
            inner.set_requires_gradient_sync(True)
        yield
        return
    if isinstance(inner, torch.nn.parallel.DistributedDataParallel):
        with inner.no_sync():
            yield
    elif is_sharded(inner):
        inner.set_requires_gradient_sync(False)
        yield
    else:
        yield
