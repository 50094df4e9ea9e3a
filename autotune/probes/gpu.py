"""NVIDIA GPUs through NVML.

NVML is passed in (``nvml=``) rather than imported at module level so
tests can hand in a fake, and so importing ``probes`` never loads
libnvidia-ml.  Every NVML failure degrades to an empty list plus a reason:
a probe must describe a GPU-less machine, not crash on it.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

# Local copies of NVML enum values: some nvidia-ml-py releases export
# NVML_P2P_CAPS_INDEX_READ as a 1-tuple, which ctypes then rejects.
P2P_CAPS_READ = 0
P2P_CAPS_NVLINK = 2
P2P_STATUS_OK = 0
P2P_STATUS_NAMES = {
    0: "ok",
    1: "chipset_not_supported",
    2: "gpu_not_supported",
    3: "ioh_topology_not_supported",
    4: "disabled_by_regkey",
    5: "not_supported",
    6: "unknown",
}
# nvmlDeviceGetTopologyCommonAncestor levels, named like `nvidia-smi topo -m`.
TOPOLOGY_NAMES = {0: "internal", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}


@dataclass
class GpuInfo:
    index: int
    name: str
    memory_bytes: int | None = None
    compute_capability: str | None = None
    uuid: str | None = None
    pci_bus_id: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class GpuLink:
    a: int
    b: int
    p2p: str | None  # P2P read status name, "ok" when usable
    nvlink: bool | None
    topology: str | None  # common PCIe ancestor, None when NVML can't say

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


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
            warnings.append(f"NVML found no GPUs but torch sees {torch_device_count}")
        return warnings
    if torch_cuda_available is None:
        return warnings  # torch not probed
    if not torch_cuda_build:
        warnings.append(f"{len(gpus)} NVIDIA GPU(s) present but torch is a CPU-only build")
    elif not torch_cuda_available:
        warnings.append(f"{len(gpus)} NVIDIA GPU(s) present but torch.cuda.is_available() is False")
    elif torch_device_count is not None and torch_device_count != len(gpus) and cuda_visible_devices is None:
        warnings.append(f"NVML reports {len(gpus)} GPU(s) but torch sees {torch_device_count}")
    return warnings


# ---------------------------------------------------------------- readers

def load_nvml() -> Any:
    """The real pynvml module; ImportError propagates to the caller."""
    import pynvml

    return pynvml


def read_gpus(nvml: Any = None) -> GpuProbe:
    """Query NVML.  ``nvml`` is any object with pynvml's function names."""
    if nvml is None:
        try:
            nvml = load_nvml()
        except ImportError as exc:
            return GpuProbe(error=f"pynvml not installed ({exc})")
    try:
        nvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, OSError...
        return GpuProbe(error=f"NVML unavailable: {type(exc).__name__}: {exc}")
    try:
        return _query(nvml)
    except Exception as exc:
        return GpuProbe(error=f"NVML query failed: {type(exc).__name__}: {exc}")
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:
            pass


def _query(nvml: Any) -> GpuProbe:
    driver = {
        "version": _optional(lambda: decode(nvml.nvmlSystemGetDriverVersion())),
        "cuda_driver_version": format_cuda_driver_version(_optional(nvml.nvmlSystemGetCudaDriverVersion)),
    }
    handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
    gpus = [_gpu(nvml, i, h) for i, h in enumerate(handles)]
    links = [
        _link(nvml, i, j, handles[i], handles[j])
        for i in range(len(handles))
        for j in range(i + 1, len(handles))
    ]
    return GpuProbe(gpus=gpus, links=links, driver=driver)


def _gpu(nvml: Any, index: int, handle: Any) -> GpuInfo:
    capability = _optional(lambda: nvml.nvmlDeviceGetCudaComputeCapability(handle))
    memory = _optional(lambda: nvml.nvmlDeviceGetMemoryInfo(handle).total)
    return GpuInfo(
        index=index,
        name=decode(nvml.nvmlDeviceGetName(handle)),
        memory_bytes=int(memory) if memory is not None else None,
        compute_capability=f"{capability[0]}.{capability[1]}" if capability else None,
        uuid=_optional(lambda: decode(nvml.nvmlDeviceGetUUID(handle))),
        pci_bus_id=_optional(lambda: decode(nvml.nvmlDeviceGetPciInfo(handle).busId)),
    )


def _link(nvml: Any, i: int, j: int, hi: Any, hj: Any) -> GpuLink:
    read = _optional(lambda: nvml.nvmlDeviceGetP2PStatus(hi, hj, P2P_CAPS_READ))
    nvlink = _optional(lambda: nvml.nvmlDeviceGetP2PStatus(hi, hj, P2P_CAPS_NVLINK))
    topo = _optional(lambda: nvml.nvmlDeviceGetTopologyCommonAncestor(hi, hj))
    return GpuLink(
        a=i,
        b=j,
        p2p=P2P_STATUS_NAMES.get(read, str(read)) if read is not None else None,
        nvlink=(nvlink == P2P_STATUS_OK) if nvlink is not None else None,
        topology=TOPOLOGY_NAMES.get(topo, str(topo)) if topo is not None else None,
    )


def _optional(fn: Any) -> Any:
    """Per-field NVML calls may be unsupported on a given GPU or driver
    (NVMLError_NotSupported); that field becomes None, the rest survives."""
    try:
        return fn()
    except Exception:
        return None
