"""Where the search starts besides the user's configuration: what a practitioner would
run first on this machine (PyTorch's CPU launcher defaults; on GPUs what an expert runs:
one rank per GPU in bf16, fed by the host's cores). The tuner enqueues them after the
baseline; the batch range is measured on the first."""
from __future__ import annotations

from autotune.config import KnobValue, TrialConfig
from autotune.probes import Machine
from autotune.runtime.knobs import Affinity, Allocator, Device, OptimizerStep, Precision
from autotune.space import Space


def gpu_start(space: Space, machine: Machine) -> list[TrialConfig]:
    """What a practitioner starts from on GPUs: one rank per visible GPU over NCCL, bf16
    autocast where the GPUs have it (Ampere or later; TF32 where only that is offered),
    DataLoader workers up to each rank's share of the host's cores (less its own), pinned (and so
    persistent), cuDNN's benchmark where the model has convolutions, the fused optimizer
    step where torch has one for its optimizer; at the smallest searched batch from the
    user's up that the ranks split (the batch range then moves it: ``search.queued``)."""
    params = {k: v[0] for k, v in space.choices.items()}
    ranks = max(layout.nprocs for layout in space.layouts)
    params["layout"] = next(str(layout) for layout in space.layouts if layout.nprocs == ranks)
    sizes = sorted(space.choices.get("batch_size", [space.baseline.batch_size]))
    split = [b for b in sizes if b % ranks == 0]
    if not split:
        return []
    params["batch_size"] = next((b for b in split if b >= space.baseline.batch_size), split[-1])
    precisions = space.choices.get("precision", [])
    wanted: dict[str, KnobValue] = {
        "precision": next((p for p in (Precision.BF16, Precision.TF32) if p in precisions), Precision.FP32),
        "pin_memory": True, "cudnn_benchmark": True, "optimizer_step": OptimizerStep.FUSED}
    for knob, value in wanted.items():
        if value in space.choices.get(knob, []):
            params[knob] = value
    if workers := space.choices.get("num_workers"):
        # a rank's share of the cores, less the one its own process trains on
        per_rank = max(workers)
        params["num_workers"] = max((n for n in workers if n < per_rank), default=per_rank)
    start = space.config_from_params(params)
    # its fp32 twin: the exact configuration verification falls back on when bf16's
    # numerics fail, measured early on all GPUs too
    twin = space.config_from_params({**params, "precision": Precision.FP32})
    return list(dict.fromkeys([start, twin]))


def heuristics(space: Space, machine: Machine) -> list[TrialConfig]:
    """The start points that are not the baseline: on GPUs ``gpu_start``; on CPU PyTorch's
    CPU launcher defaults: one process on all usable cores, tcmalloc or jemalloc
    preloaded where found, compact core pinning."""
    if space.baseline.device == Device.CUDA:
        return gpu_start(space, machine)
    if space.baseline.device != Device.CPU:
        return []
    cores = machine.cpu.usable_cores
    params = {k: v[0] for k, v in space.choices.items()}
    params.update(layout=f"1x{cores}", batch_size=space.baseline.batch_size, num_workers=0)
    if params["layout"] not in space.choices["layout"]:
        return []
    allocators = space.choices.get("allocator", [])
    for name in (Allocator.TCMALLOC, Allocator.JEMALLOC):
        if name in allocators:
            params["allocator"] = name
            break
    if Affinity.COMPACT in space.choices.get("affinity", []):
        params["affinity"] = Affinity.COMPACT
    return [space.config_from_params(params)]
