"""Which configurations verification may hold on the GPUs at once.

Verification measures configurations side by side, round after round, one window each in
turn (``autotune.verify.side_by_side``). On a CPU every configuration is held alive between
its windows. On GPUs a held process keeps its CUDA context and what its caching allocator
reserved, so configurations are held together only where their device memory, as the
search measured it, fits within a share of each GPU; the others are started fresh for each
visit, alone with whatever is held. Under EXCLUSIVE_PROCESS compute mode a GPU admits one
process at a time, and under MIG each process sees one slice: there every visit is fresh.

Holding matters on GPUs more than anywhere: a fresh visit repeats the interpreter's start,
the imports, ``build_dataset``, the CUDA context, the DataLoader's workers and, for a
compiled configuration, Dynamo's trace and the CUDA-graph capture (the on-disk compile
cache spares only the compilation itself), for a few seconds of measuring.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence

from autotune.config import TrialConfig
from autotune.probes import Machine
from autotune.runtime.knobs import Device

# What processes held together may take of each GPU: the rest is slack for a peak the
# search's windows did not reach (a DataLoader batch larger than usual, cuDNN workspaces).
SHARE = 0.85
# Per process and GPU, beside what its allocator reserved: the CUDA context and the
# cuBLAS and cuDNN handles, which the allocator's peak does not count (about 0.5 GiB on an
# H100 with torch 2.x; more is kept so that an estimate errs towards a fresh visit).
CONTEXT_MB = 768.0


@dataclasses.dataclass(frozen=True)
class DeviceRoom:
    """What held processes may take of each GPU (``capacity_mb``; None: no GPU), why no
    process may be held there (``fresh``: exclusive compute mode, MIG), and each measured
    configuration's device peak per rank, in MiB, as the search's trials reported it."""

    capacity_mb: float | None = None
    fresh: str | None = None
    peaks_mb: Mapping[TrialConfig, float] = dataclasses.field(default_factory=dict)

    @classmethod
    def of(cls, machine: Machine, measured: Iterable[tuple[TrialConfig, float | None]]) -> DeviceRoom:
        """The room on ``machine``'s GPUs, with the search's ``measured`` trials
        (configuration, its GPU's peak in MiB: ``cuda_peak_mb``, None where unknown)."""
        devices = cuda_devices(machine)
        if not devices:
            return cls()
        peaks = {cfg: peak for cfg, peak in measured if peak is not None}
        smallest = min(float(d.memory_bytes) for d in devices) / 2**20
        for d in devices:
            if d.mig:
                return cls(smallest * SHARE, "the GPUs are MIG slices: each visit is started fresh", peaks)
            if d.compute_mode in ("exclusive_process", "exclusive_thread", "prohibited"):
                return cls(smallest * SHARE, f"the GPUs are in {d.compute_mode} compute mode, which admits "
                                             "one process at a time: each visit is started fresh", peaks)
        return cls(smallest * SHARE, None, peaks)

    def need_mb(self, cfg: TrialConfig) -> float | None:
        """What a process of ``cfg`` holds on each of its GPUs, its context included: the
        peak measured for it; for one the search did not measure (the ablation's variants),
        an estimate that errs high (``_estimate``). None where nothing was measured."""
        peak = self.peaks_mb.get(cfg)
        if peak is None:
            peak = self._estimate(cfg)
        return None if peak is None else peak + CONTEXT_MB

    def _estimate(self, cfg: TrialConfig) -> float | None:
        """The largest peak measured at a micro-batch at least ``cfg``'s; else the peaks at
        the largest micro-batch measured, scaled up in proportion (weights and optimizer
        state do not grow with it). Twice that for fp32 from a reduced-precision peak:
        autocast's activations are half fp32's at most."""
        if not self.peaks_mb:
            return None
        above = [(c, p) for c, p in self.peaks_mb.items() if c.micro_batch >= cfg.micro_batch]
        if not above:
            largest = max(c.micro_batch for c in self.peaks_mb)
            above = [(c, p * cfg.micro_batch / largest) for c, p in self.peaks_mb.items()
                     if c.micro_batch == largest]
        return max(p * (2.0 if cfg.exact and not c.exact else 1.0) for c, p in above)

    def held_together(self, configs: Sequence[TrialConfig]) -> set[int]:
        """The indices of ``configs`` to hold alive for a whole side-by-side session;
        the others are visited fresh, one at a time, beside those held. The reference
        (index 0) first, then the others in order, each while it fits with room left for
        the largest visitor. Every index on a CPU; none where the GPUs admit no held
        process, or where a configuration's need is unknown and so might not fit."""
        if not any(cfg.device == Device.CUDA for cfg in configs):
            return set(range(len(configs)))
        if self.capacity_mb is None or self.fresh is not None:
            return set()
        needs = [self.need_mb(cfg) for cfg in configs]
        if any(n is None for n in needs):
            return set()
        sizes = [float(n) for n in needs if n is not None]
        held: list[int] = []
        for i in range(len(configs)):
            trial = [*held, i]
            visitors = [sizes[j] for j in range(len(configs)) if j not in trial]
            if sum(sizes[j] for j in trial) + max(visitors, default=0.0) <= self.capacity_mb:
                held = trial
        return set(held)


@dataclasses.dataclass(frozen=True)
class CudaDevice:
    """A device CUDA enumerates in a trial, as far as holding processes on it goes."""

    memory_bytes: int
    compute_mode: str  # nvml.COMPUTE_MODE_NAMES; "default" where NVML could not say
    mig: bool  # a MIG slice


def cuda_devices(machine: Machine) -> list[CudaDevice]:
    """The devices CUDA enumerates in a trial (torch's probe), each with its memory, its
    compute mode and whether it is a MIG slice (from NVML's entry of the same PCI bus id
    or UUID)."""
    nvml = list(machine.gpus)
    out = []
    for dev in machine.torch.cuda_devices:
        if not dev.memory_bytes:
            continue
        parent = next((g for g in nvml if (dev.pci_bus_id and g.pci_bus_id == dev.pci_bus_id)
                       or (dev.uuid and g.uuid == dev.uuid)), None)
        mode = (parent.compute_mode if parent else None) or "default"
        mig = str(dev.uuid or "").startswith("MIG-") or bool(parent and parent.mig)
        out.append(CudaDevice(memory_bytes=dev.memory_bytes, compute_mode=mode, mig=mig))
    return out
