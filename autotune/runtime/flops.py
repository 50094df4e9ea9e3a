"""The FLOPs of one training step, counted by PyTorch's FlopCounterMode on a real batch:
the model's forward and backward passes. The optimizer's update is element-wise, a few
FLOPs per parameter against the thousands per parameter of a step's matrix products,
and is not counted.

What is counted is the model's arithmetic, whatever runs it: FlopCounterMode counts an
operator by its shapes, so a bf16 step counts what an fp32 one does; it does not see
inside compiled graphs, so a compiled model is counted uncompiled (the same arithmetic,
which compilation fuses but does not remove); activation checkpointing's recomputation
in the backward pass is not the model's and is left out (model FLOPs, as MFU counts
them). One micro-batch of one rank is counted: a step of the whole job is that times
its micro-batches and ranks, so FLOPs per sample is the figure that holds for all.
"""
from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Sequence

import torch

from . import memory_knobs
from .data import first_tensor, move
from .model import unwrap_model, user_loss
from .session import Session


@dataclasses.dataclass(frozen=True, kw_only=True)
class StepFlops:
    """The FLOPs of one micro-batch's forward and backward on one rank, and its samples."""

    flops: int
    samples: int

    @property
    def per_sample(self) -> float:
        return self.flops / self.samples


_CPU_SDPA_REGISTERED = False


def _register_cpu_attention() -> None:
    """FlopCounterMode knows the CUDA attention kernels (flash, memory-efficient, cuDNN) but
    not the one scaled_dot_product_attention runs on CPU, whose FLOPs it would leave out: the
    same formulas, registered once for it (a model counted on CPU then counts what it does on
    a GPU)."""
    global _CPU_SDPA_REGISTERED
    aten = torch.ops.aten
    forward = getattr(aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    backward = getattr(aten, "_scaled_dot_product_flash_attention_for_cpu_backward", None)
    if _CPU_SDPA_REGISTERED or forward is None or backward is None:
        return
    from torch.utils import flop_counter

    if forward not in flop_counter.flop_registry:
        @flop_counter.register_flop_formula(forward)
        def _forward(query, key, value, *args, out_shape=None, **kwargs) -> int:
            return flop_counter.sdpa_flop_count(query, key, value)

    if backward not in flop_counter.flop_registry:
        @flop_counter.register_flop_formula(backward)
        def _backward(grad_out, query, key, value, *args, out_shape=None, **kwargs) -> int:
            return flop_counter.sdpa_backward_flop_count(grad_out, query, key, value)

    _CPU_SDPA_REGISTERED = True


def count_flops(loss_of: Callable[[], torch.Tensor], *, recomputed: Sequence[torch.nn.Module] = ()) -> int:
    """The FLOPs of ``loss_of()`` and its backward pass. ``recomputed``: modules whose
    forward runs again in the backward pass (checkpointed blocks): their forward is
    counted once."""
    from torch.utils.checkpoint import set_checkpoint_early_stop
    from torch.utils.flop_counter import FlopCounterMode

    _register_cpu_attention()
    counter = FlopCounterMode(display=False)
    started: dict[int, int] = {}
    again = [0]

    def before(module: torch.nn.Module, args: tuple) -> None:
        started[id(module)] = counter.get_total_flops()

    def after(module: torch.nn.Module, args: tuple, output: object) -> None:
        again[0] += counter.get_total_flops() - started.pop(id(module))

    hooks = [m.register_forward_pre_hook(before) for m in recomputed]
    hooks += [m.register_forward_hook(after) for m in recomputed]
    try:
        # without early stop the recomputation runs the whole forward it subtracts
        with set_checkpoint_early_stop(False), counter:
            loss_of().backward()
    finally:
        for h in hooks:
            h.remove()
    return counter.get_total_flops() - again[0]


@contextlib.contextmanager
def uncompiled(model: torch.nn.Module) -> Iterator[None]:
    """The blocks compiled in place (Module.compile, as under sharding) run eagerly inside."""
    compiled = [m for m in model.modules() if getattr(m, "_compiled_call_impl", None) is not None]
    saved = [m._compiled_call_impl for m in compiled]
    for m in compiled:
        m._compiled_call_impl = None
    try:
        yield
    finally:
        for m, impl in zip(compiled, saved, strict=True):
            m._compiled_call_impl = impl


def step_flops(session: Session) -> StepFlops | None:
    """Count one micro-batch of the session's next batch (which stays the next one) on
    the user's model, outside DDP's wrapper (no gradient synchronisation) and compile's;
    its gradients are dropped (the next step sets them to None first anyway). None for a
    sharded model, whose forward and backward are collectives of every rank: a count that
    failed on one rank would leave the others waiting in them."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

    model = unwrap_model(session.model)
    if memory_knobs.is_sharded(model):
        return None
    cfg, device = session.cfg, session.dist.device
    batch = move(session.peek_batch(), device, channels_last=bool(cfg.get("channels_last")))
    part = memory_knobs.micro_batches(batch, int(cfg.get("grad_accum") or 1))[0]
    first = first_tensor(part)
    if first is None or first.dim() == 0 or first.shape[0] == 0:
        return None
    # A slice of the fewest samples (at least two: BatchNorm trains on no fewer) that splits
    # the micro-batch evenly: FLOPs per sample are the same, and the count, which holds what
    # a step holds, raises no trial's measured peak (it runs outside checkpointing's savings
    # and compile's fusion).
    samples = int(first.shape[0])
    least = next((d for d in range(2, samples + 1) if samples % d == 0), samples)
    part = memory_knobs.micro_batches(part, samples // least)[0]
    first = first_tensor(part)
    assert first is not None
    wrappers = [m for m in model.modules() if isinstance(m, CheckpointWrapper)]
    try:
        with uncompiled(model):
            flops = count_flops(lambda: user_loss(session.user, model, part, cfg=cfg, device=device),
                                recomputed=wrappers)
    finally:
        model.zero_grad(set_to_none=True)
    return StepFlops(flops=int(flops), samples=int(first.shape[0])) if flops > 0 else None
