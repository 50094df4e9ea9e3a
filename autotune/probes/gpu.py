"""NVIDIA GPUs as the probe document holds them, and the pure readings of what torch and
NVML say about them (bus ids, UUIDs, driver versions).

The devices a trial sees, their order and compute capability come from the
torch probe (``cuda_devices``, see ``torch_device``): CUDA itself enumerates them
there, honouring CUDA_VISIBLE_DEVICES and MIG, and it works where libnvidia-ml is not
mounted. NVML (``probes.nvml``) adds what torch does not say (compute mode, MIG
instances, links, other processes) and is the fallback for documents without torch's
list; ``probes.cuda_visible`` merges the two into the GPUs a trial will use.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .torch_build import TorchDevice


@dataclass(frozen=True)
class MigDevice:
    """One MIG device of a MIG-enabled GPU, as NVML lists it: CUDA_VISIBLE_DEVICES names
    it by its MIG-... UUID."""

    index: int = 0  # its slot under the parent GPU
    uuid: str | None = None
    name: str | None = None
    memory_bytes: int | None = None


@dataclass
class GpuInfo:
    index: int
    name: str
    memory_bytes: int | None = None
    compute_capability: str | None = None
    uuid: str | None = None
    pci_bus_id: str | None = None
    compute_mode: str | None = None  # nvml.COMPUTE_MODE_NAMES; None when NVML could not say
    mig: bool = False
    mig_devices: list[MigDevice] = field(default_factory=list)  # a MIG-enabled GPU's instances
    processes: int | None = None  # compute processes NVML saw on it, None when unknown


@dataclass
class GpuLink:
    a: int = 0
    b: int = 0
    p2p: str | None = None  # P2P read status name, "ok" when usable
    nvlink: bool | None = None
    topology: str | None = None  # common PCIe ancestor, None when NVML can't say


@dataclass
class GpuProbe:
    gpus: list[GpuInfo] = field(default_factory=list)
    links: list[GpuLink] = field(default_factory=list)
    driver: dict[str, str | None] = field(default_factory=lambda: {"version": None, "cuda_driver_version": None})
    error: str | None = None


# ---------------------------------------------------------------- parsers

def decode(value: Any) -> str:
    """NVML strings are bytes in old bindings and str in new ones."""
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)


def format_cuda_driver_version(version: int | None) -> str | None:
    """nvmlSystemGetCudaDriverVersion's 12040 -> "12.4"."""
    if not version:
        return None
    return f"{version // 1000}.{(version % 1000) // 10}"


def format_pci_bus_id(domain: int, bus: int, device: int) -> str:
    """torch's pci_domain_id/pci_bus_id/pci_device_id -> NVML's busId, "00000000:18:00.0"."""
    return f"{domain:08X}:{bus:02X}:{device:02X}.0"


def pci_key(bus_id: str | None) -> tuple[int, int, int, int] | None:
    """A bus id as numbers, so NVML's "00000000:18:00.0", its legacy "0000:18:00.0"
    and a lower-case spelling compare equal; None when it is not one."""
    match = re.fullmatch(r"\s*([0-9a-fA-F]+):([0-9a-fA-F]+):([0-9a-fA-F]+)\.([0-9a-fA-F]+)\s*", bus_id or "")
    return tuple(int(part, 16) for part in match.groups()) if match else None  # type: ignore[return-value]


def is_mig_name(name: str | None) -> bool:
    """CUDA names a MIG device after its parent and profile: "NVIDIA H100 80GB HBM3 MIG 3g.40gb"."""
    return bool(re.search(r"\bMIG\b", name or ""))


def cuda_uuid(raw: str | None, *, mig: bool) -> str | None:
    """str(torch's props.uuid) -> the UUID as nvidia-smi prints it and CUDA_VISIBLE_DEVICES
    takes it: "GPU-<uuid>", or "MIG-<uuid>" for a MIG device."""
    if not raw:
        return None
    raw = str(raw).strip()
    if raw.startswith(("GPU-", "MIG-")):
        return raw
    return ("MIG-" if mig else "GPU-") + raw


def torch_device(raw: Mapping[str, Any]) -> TorchDevice:
    """One entry of the torch child's ``cuda_devices`` (raw uuid, PCI numbers) -> the
    document's entry: name, compute_capability, memory_bytes, uuid, pci_bus_id."""
    name = raw.get("name")
    pci = raw.get("pci")
    pci_bus_id = None
    if isinstance(pci, (list, tuple)) and len(pci) == 3 and all(isinstance(v, int) for v in pci):
        pci_bus_id = format_pci_bus_id(*pci)
    elif (key := pci_key(raw.get("pci_bus_id"))) is not None:
        pci_bus_id = format_pci_bus_id(*key[:3])  # cudaDeviceGetPCIBusId's "0000:18:00.0"
    memory = raw.get("memory_bytes")
    return TorchDevice(
        name=name,
        compute_capability=raw.get("compute_capability"),
        memory_bytes=int(memory) if isinstance(memory, (int, float)) else None,
        uuid=cuda_uuid(raw.get("uuid"), mig=is_mig_name(name)),
        pci_bus_id=pci_bus_id,
    )


def cross_check_torch(
    gpus: list[GpuInfo],
    *,
    torch_cuda_build: str | None,
    torch_cuda_available: bool | None,
    torch_device_count: int | None,
    cuda_visible_devices: str | None,
) -> list[str]:
    """Warnings where NVML and torch disagree about usable GPUs."""
    warnings: list[str] = []
    if not gpus:
        if torch_device_count:
            warnings.append(f"NVML found no GPUs but torch sees {torch_device_count}: tuning on torch's devices, "
                            "without their compute mode, links or other processes")
        return warnings
    if torch_cuda_available is None:
        return warnings  # torch not probed
    if not torch_cuda_build:
        warnings.append(f"{len(gpus)} NVIDIA GPU(s) present but torch is a CPU-only build")
    elif not torch_cuda_available:
        warnings.append(f"{len(gpus)} NVIDIA GPU(s) present but torch.cuda.is_available() is False")
    elif torch_device_count is not None and torch_device_count != len(gpus) and cuda_visible_devices is None:
        if any(g.mig for g in gpus):
            warnings.append(f"MIG is on: a process sees one MIG device, not the {len(gpus)} GPU(s); "
                            "CUDA_VISIBLE_DEVICES=MIG-... picks which")
        else:
            warnings.append(f"NVML reports {len(gpus)} GPU(s) but torch sees {torch_device_count}")
    return warnings
