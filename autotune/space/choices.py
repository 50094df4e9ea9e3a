"""The choices of the search space: one builder per knob, which returns the knob's candidate
values on this machine and model, and a reason for every value it leaves out.

``space.build_space`` composes them; the reasons are shown by ``autotune probe`` and ``run``.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

from autotune.config import Layout
from autotune.errors import UsageError
from autotune.probes.compiler import CompilerCheck
from autotune.probes.extensions import IpexStatus
from autotune.probes.gpu import GpuInfo
from autotune.runtime.knobs import Affinity, Allocator, Backend, CompileMode, Device, Precision, Sharding

GRAD_ACCUM_STEPS = [1, 2, 4, 8, 16, 32]


def default_batch_top(base: int) -> int:
    """The largest batch of the default range: eight times the user's ``base``, rounded to
    its nearest power of two (the range without --batch-range or a measured one)."""
    return max(base, 2 ** round(math.log2(base)) * 8)


def batch_ladder(base: int, top: int) -> list[int]:
    """``base`` and ``top``, and the powers of two from a quarter of ``base`` up to ``top``."""
    p = 2 ** round(math.log2(base))
    values = {base, max(base, top)} | {p >> k for k in (1, 2)} | {p << k for k in range(64) if p << k <= top}
    return sorted(v for v in values if v >= 1)


@dataclasses.dataclass(frozen=True)
class KnobChoice:
    """What one builder decides for its knob: the values to search (empty: the knob is
    not searched at all) and ``"knob[=value]" -> reason`` for each value it leaves out."""

    values: list[Any]
    excluded: dict[str, str] = dataclasses.field(default_factory=dict)


def _ranks(layout: str) -> int:
    return Layout.parse(layout).nprocs


def device_choice(gpus: Sequence[GpuInfo], hidden: Sequence[str], *, cuda_available: bool,
                  pinned: str | None, present: int = 0) -> KnobChoice:
    """The one device to tune on: a GPU machine tunes on the GPUs torch sees, anything
    else on CPU. ``present``: the GPUs NVML found, to say why torch's are missing."""
    cuda = bool(gpus) and cuda_available
    if pinned == Device.CUDA and not cuda:
        raise UsageError("--fix device=cuda: no CUDA GPU usable by torch on this machine")
    excluded: dict[str, str] = {}
    if hidden:
        excluded[f"gpus={','.join(hidden)}"] = "hidden by CUDA_VISIBLE_DEVICES"
    if (present or gpus) and not cuda_available:
        excluded["device=cuda"] = "GPUs present but this torch build cannot use them"
    elif not gpus:
        excluded["device=cuda"] = "no NVIDIA GPU found" + (" visible" if hidden else "")
    return KnobChoice([pinned or (Device.CUDA if cuda else Device.CPU)], excluded)


def machine_layouts(device: str, cores: int, gpu_count: int, backends: Mapping[str, bool]) -> KnobChoice:
    """Layouts (``RANKSxTHREADS``) the hardware allows: on CPU every split of the usable
    cores into ranks x threads; on CUDA one to ``gpu_count`` ranks, one per GPU, several
    each with an equal share of the cores, and one with PyTorch's default threads, as the
    baseline has them: the GPU does the work, so a thread count of its own would only make
    one rank differ from the baseline in nothing that matters (and the ablation measure
    that difference). Several ranks need a working backend."""
    if device == Device.CUDA:
        layouts = ["1xdefault"] + [f"{n}x{max(1, cores // n)}" for n in range(2, gpu_count + 1)]
        if gpu_count > 1 and not backends.get(Backend.NCCL):
            return KnobChoice(layouts[:1], {"nprocs>1": "NCCL did not initialise on this machine"})
        return KnobChoice(layouts)
    layouts = [f"{n}x{t}" for n in range(1, cores + 1) for t in range(1, cores // n + 1)]
    excluded: dict[str, str] = {}
    if not backends.get(Backend.GLOO):
        layouts = [s for s in layouts if _ranks(s) == 1]
        excluded["nprocs>1"] = "the gloo backend did not initialise on this machine"
    if cores == 1:
        excluded["nprocs>1"] = "only one usable core"
    return KnobChoice(layouts, excluded)


def _batchnorm_reason(batchnorm_layers: Sequence[str]) -> str:
    shown = ", ".join(f"'{n}'" for n in list(batchnorm_layers)[:3])
    more = ", ..." if len(batchnorm_layers) > 3 else ""
    return (f"the model has BatchNorm layers ({shown}{more}): with several ranks each normalizes "
            "over its own share of the batch, which changes training, so the numerics check "
            "would reject it (on CPU; on GPUs SyncBatchNorm keeps it)")


def layout_choice(device: str, cores: int, gpu_count: int, backends: Mapping[str, bool], *,
                  batchnorm_layers: Sequence[str], nprocs: int | None, threads: int | None) -> KnobChoice:
    """The machine's layouts, narrowed to one rank for a BatchNorm model on CPU and to
    the pinned ranks (``nprocs``) and threads, when given."""
    machine = machine_layouts(device, cores, gpu_count, backends)
    layouts, excluded = list(machine.values), dict(machine.excluded)
    if batchnorm_layers and device == Device.CPU and any(_ranks(s) > 1 for s in layouts):
        # DDP normalizes each rank's share of the batch on its own: the loss no longer
        # matches one process, and verification's numerics check rejects every such
        # candidate. On GPUs the runtime converts BatchNorm to SyncBatchNorm, which
        # normalizes over the global batch as one process does; on CPU (gloo) that costs
        # an all-gather of statistics per layer per step, so several ranks are not searched.
        reason = _batchnorm_reason(batchnorm_layers)
        if (nprocs or 1) > 1:
            raise UsageError(f"--fix nprocs={nprocs}: {reason}. Remove the --fix, or "
                             "replace BatchNorm (e.g. GroupNorm) if you need several ranks.")
        layouts = [s for s in layouts if _ranks(s) == 1]
        excluded["nprocs>1"] = reason
    if nprocs is not None:
        layouts = [s for s in layouts if _ranks(s) == nprocs]
    if threads is not None and device == Device.CUDA:  # the GPUs' ranks with the pinned threads each
        layouts = [str(Layout(n, threads)) for n in map(_ranks, layouts) if n * threads <= cores]
    elif threads is not None:
        layouts = [s for s in layouts if Layout.parse(s).threads == threads]
    if not layouts:
        raise UsageError(
            f"--fix nprocs/threads leaves no layout within the {cores} usable cores "
            "(ranks x threads must not exceed them)"
        )
    return KnobChoice(layouts, excluded)


def batch_size_choice(baseline_batch: int, dataset_len: int | None, pinned: int | None,
                      batch_range: tuple[int, int] | None = None) -> KnobChoice:
    """Powers of two around the user's batch size (a quarter to eight times it), or within
    ``batch_range`` (``--batch-range LOW-HIGH``: its powers of two and its ends, the user's
    batch where it lies within), none larger than the dataset."""
    if pinned is not None:
        return KnobChoice([pinned])
    excluded: dict[str, str] = {}
    if batch_range is None:
        batches = batch_ladder(baseline_batch, default_batch_top(baseline_batch))
    else:
        low, high = batch_range
        batches = sorted({low, high, *(2**k for k in range(high.bit_length()) if low <= 2**k <= high),
                          *([baseline_batch] if low <= baseline_batch <= high else [])})
        excluded[f"batch_size<{low},>{high}"] = f"outside --batch-range {low}-{high}"
    if dataset_len and any(b > dataset_len for b in batches):
        excluded[f"batch_size>{dataset_len}"] = "larger than the dataset"
        batches = [b for b in batches if b <= dataset_len] or [baseline_batch]
    return KnobChoice(batches, excluded)


def pairable(layouts: Sequence[str], batches: Sequence[int]) -> KnobChoice:
    """The layouts whose ranks split at least one batch size evenly. Each sampled
    (layout, batch) pair that does not split is skipped by the search (``Space.splits``),
    so a rank count is never dropped because some other batch size does not suit it
    (8 GPUs at the user's batch 50 still meet batch 16, 32, 64...); the first layout
    stays if none splits any."""
    even = [s for s in layouts if any(b % _ranks(s) == 0 for b in batches)]
    dropped = [s for s in layouts if s not in even]
    excluded = {"layout=" + ",".join(dropped): "its ranks split none of the batch sizes evenly"} if dropped else {}
    return KnobChoice(even or list(layouts[:1]), excluded)


def backend_choice(device: str, backends: Mapping[str, bool], max_ranks: int) -> KnobChoice:
    """The collective backend: NCCL on GPUs; gloo on CPU, and oneCCL too where it is
    installed and a layout has several ranks for it to matter."""
    excluded: dict[str, str] = {}
    if device == Device.CUDA:
        values = [Backend.NCCL]
        excluded["backend=gloo"] = "on GPUs NCCL is the backend that helps"
    else:
        values = [Backend.GLOO] + ([Backend.CCL] if backends.get(Backend.CCL) and max_ranks > 1 else [])
        if not backends.get(Backend.CCL):
            excluded["backend=ccl"] = "oneccl_bindings_for_pytorch is not installed"
    excluded["backend=mpi"] = "needs an MPI launcher (mpirun); autotune starts its ranks itself, on one machine"
    return KnobChoice(values, excluded)


def num_workers_choice(device: str, cores: int, gpu_count: int) -> KnobChoice:
    """DataLoader workers: on CPU none up to one per core, at most 4 (they take cores from
    the training threads); on GPUs, where the host cores only feed the devices, powers of
    two up to each rank's share of the cores, and that share itself (12 of 12 cores a GPU)."""
    if device == Device.CUDA:
        per_rank = max(1, cores // max(1, gpu_count))
        return KnobChoice(sorted({0, per_rank} | {2**i for i in range(per_rank.bit_length()) if 2**i <= per_rank}))
    return KnobChoice(list(range(min(cores, 4) + 1)))


def pin_memory_choice(device: str) -> KnobChoice:
    if device == Device.CUDA:
        return KnobChoice([False, True])
    return KnobChoice([], {"pin_memory": "pinned memory only helps copies to a GPU"})


def interop_threads_choice(device: str) -> KnobChoice:
    """torch's inter-op pool: its default size, or one thread, on CPU. On GPUs the pool
    runs little (the work is on the device), and the knob is a process knob: each value
    would cost a fresh process per trial for nothing."""
    if device == Device.CUDA:
        return KnobChoice([], {"interop_threads": "torch's inter-op pool does little when the GPU does the "
                                                  "work, and each value needs a process of its own"})
    return KnobChoice([None, 1])


def compile_choice(device: str, compiler: CompilerCheck) -> KnobChoice:
    """torch.compile modes. Inductor builds C++ on CPU and Triton builds its launchers
    with the host C compiler on GPUs, so both need a working compiler; CUDA graphs
    (reduce-overhead) exist only on GPUs."""
    if not compiler.available:
        what = "a working C++ compiler" if device == Device.CPU else "a C compiler for Triton's launchers"
        reason = f"torch.compile needs {what}: {compiler.reason or 'none found'}"
        return KnobChoice([CompileMode.OFF], {"compile": reason})
    modes = [CompileMode.OFF, CompileMode.DEFAULT, CompileMode.MAX_AUTOTUNE_NO_CUDAGRAPHS]
    if device == Device.CUDA:
        return KnobChoice([*modes, CompileMode.REDUCE_OVERHEAD])
    return KnobChoice(modes, {"compile=reduce-overhead": "CUDA graphs: a no-op on CPU"})


def cudnn_benchmark_choice(device: str, *, convolutions: bool = True) -> KnobChoice:
    """cuDNN's per-shape algorithm search: off by PyTorch's default (and the baseline's),
    searched on GPUs, where it pays for fixed-shape convolutions and costs at each new shape;
    a model without convolutions gives it nothing to choose."""
    if device != Device.CUDA:
        return KnobChoice([])
    if not convolutions:
        return KnobChoice([], {"cudnn_benchmark": "the model has no convolution layers for cuDNN's benchmark "
                                                  "to choose algorithms for"})
    return KnobChoice([False, True])


def precision_choice(device: str, gpus: Sequence[GpuInfo], isa: Mapping[str, bool], *,
                     exact: bool) -> KnobChoice:
    """Autocast precisions the hardware runs natively: fp16 on any GPU, bf16 and tf32 on
    Ampere or later; on CPU bf16 only with avx512_bf16 or AMX (emulated it is slower)."""
    values = [Precision.FP32]
    excluded: dict[str, str] = {}
    if device == Device.CUDA:
        values.append(Precision.FP16)
        capability = max((float(g.compute_capability or 0) for g in gpus), default=0.0)
        if capability >= 8.0:
            values += [Precision.BF16, Precision.TF32]
        else:
            excluded["precision=bf16,tf32"] = "needs an Ampere or later GPU (compute capability 8.0)"
    else:
        if isa.get("avx512_bf16") or isa.get("amx_bf16"):
            values.append(Precision.BF16)
        else:
            excluded["precision=bf16"] = (
                "CPU has no avx512_bf16/AMX: bf16 autocast would be emulated and about 2x slower"
            )
        excluded["precision=fp16"] = "fp16 autocast with GradScaler needs a CUDA GPU"
        excluded["precision=tf32"] = "tf32 needs an Ampere or later NVIDIA GPU"
    if exact and len(values) > 1:
        excluded["precision=" + ",".join(values[1:])] = "--exact keeps fp32"
    return KnobChoice(values, excluded)


def channels_last_choice(image_inputs: bool) -> KnobChoice:
    if image_inputs:
        return KnobChoice([False, True])
    return KnobChoice([], {"channels_last": "the model's inputs are not 4-D image batches"})


def prune_ratio_choice(*, exact: bool, has_evaluate: bool, has_training_step: bool,
                       max_quality_drop: float | None, pruning_installed: bool) -> KnobChoice:
    """Structured pruning trades quality for speed: it is searched only when the model
    file can measure quality (evaluate), the user bounds the loss, and torch-pruning is
    installed; every missing condition is named. Pruning traces model(inputs), the call
    a file with its own training_step does not promise works."""
    reasons = ["--exact keeps the model unpruned"] if exact else []
    if has_training_step:
        reasons.append("the model file calls its model in training_step, which pruning cannot trace")
    if not has_evaluate:
        reasons.append("the model file has no evaluate(model)")
    if max_quality_drop is None:
        reasons.append("no --max-quality-drop given")
    if not pruning_installed:
        reasons.append("torch-pruning is not installed (pip install torch-pruning)")
    if reasons:
        return KnobChoice([], {"prune_ratio": "structured pruning trades quality: " + "; ".join(reasons)})
    return KnobChoice([0.0, 0.1, 0.25, 0.5])


def allocator_choice(device: str, allocators: Mapping[str, str | None]) -> KnobChoice:
    """Host allocators to preload on CPU: the default plus each one found on the machine."""
    if device != Device.CPU:
        return KnobChoice([], {"allocator": "host allocators matter little when the GPU does the work"})
    values = [Allocator.DEFAULT] + [name for name, path in allocators.items() if path]
    excluded = {f"allocator={name}": f"lib{name} was not found on this machine"
                for name in (Allocator.JEMALLOC, Allocator.TCMALLOC) if name not in values}
    return KnobChoice(values, excluded)


def checkpointing_choice(blocks: Sequence[str]) -> KnobChoice:
    """Recomputing activations applies to the model's repeated blocks (``Task.blocks``)."""
    if not blocks:
        return KnobChoice([], {"activation_checkpointing": "the model has no repeated blocks to recompute"})
    return KnobChoice([False, True])


def grad_accum_choice(batchnorm_layers: Sequence[str]) -> KnobChoice:
    """Micro-batches per optimizer step. BatchNorm normalizes over what one forward sees:
    over a micro-batch its statistics, and so training, change."""
    if batchnorm_layers:
        return KnobChoice([], {"grad_accum": "the model has BatchNorm layers, which would normalize "
                                             "over each micro-batch instead of the batch"})
    return KnobChoice(list(GRAD_ACCUM_STEPS))


def sharding_choice(max_ranks: int) -> KnobChoice:
    """Sharding spreads weights, gradients and optimizer state over the ranks (FSDP2)."""
    if max_ranks < 2:
        return KnobChoice([], {"sharding": "one rank: nothing to shard over"})
    return KnobChoice([s.value for s in Sharding])


def affinity_choice(device: str) -> KnobChoice:
    """Core pinning of CPU ranks; GPU ranks are not pinned."""
    return KnobChoice([Affinity.NONE, Affinity.COMPACT] if device == Device.CPU else [])


def ipex_choice(device: str, ipex: IpexStatus) -> KnobChoice:
    if device == Device.CPU and ipex.compatible:
        return KnobChoice([False, True])
    return KnobChoice([], {"ipex": f"intel-extension-for-pytorch: {ipex.reason or 'not usable'}"})
