"""Reading NVML: the GPUs the driver has, their links and the processes computing on them.

NVML is passed in (``nvml=``) rather than imported at module level so
tests can hand in a fake, and so importing ``probes`` never loads
libnvidia-ml.  Every NVML failure degrades to an empty list plus a reason:
a probe must describe a GPU-less machine, not crash on it.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .gpu import GpuInfo, GpuLink, GpuProbe, MigDevice, decode, format_cuda_driver_version

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
# nvmlDeviceGetComputeMode values (NVML_COMPUTEMODE_*).
COMPUTE_MODE_NAMES = {0: "default", 1: "exclusive_thread", 2: "prohibited", 3: "exclusive_process"}
MIG_ENABLED = 1  # NVML_DEVICE_MIG_ENABLE


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
    mode = _optional(lambda: nvml.nvmlDeviceGetComputeMode(handle))
    # (current, pending); GPUs without MIG raise NotSupported, which reads as off.
    mig_mode = _optional(lambda: nvml.nvmlDeviceGetMigMode(handle))
    mig = bool(mig_mode) and mig_mode[0] == MIG_ENABLED
    return GpuInfo(
        index=index,
        name=decode(nvml.nvmlDeviceGetName(handle)),
        memory_bytes=int(memory) if memory is not None else None,
        compute_capability=f"{capability[0]}.{capability[1]}" if capability else None,
        uuid=_optional(lambda: decode(nvml.nvmlDeviceGetUUID(handle))),
        pci_bus_id=_optional(lambda: decode(nvml.nvmlDeviceGetPciInfo(handle).busId)),
        compute_mode=COMPUTE_MODE_NAMES.get(mode, str(mode)) if mode is not None else None,
        mig=mig,
        mig_devices=_mig_devices(nvml, handle) if mig else [],
    )


def _mig_devices(nvml: Any, handle: Any) -> list[MigDevice]:
    """The MIG devices that exist under a MIG-enabled GPU.  Slots up to the maximum
    may be empty (NVML_ERROR_NOT_FOUND): those are skipped."""
    found: list[MigDevice] = []
    for slot in range(_optional(lambda: nvml.nvmlDeviceGetMaxMigDeviceCount(handle)) or 0):
        mig = _optional(lambda s=slot: nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, s))
        if mig is None:
            continue
        memory = _optional(lambda m=mig: nvml.nvmlDeviceGetMemoryInfo(m).total)
        found.append(MigDevice(
            index=slot,
            uuid=_optional(lambda m=mig: decode(nvml.nvmlDeviceGetUUID(m))),
            name=_optional(lambda m=mig: decode(nvml.nvmlDeviceGetName(m))),
            memory_bytes=int(memory) if memory is not None else None,
        ))
    return found


def read_gpu_processes(nvml: Any = None, *, own_pids: Sequence[int] = ()) -> dict[int, int] | None:
    """{NVML index: compute processes on it}, not counting ``own_pids``; None when NVML
    cannot be asked.  Called once the torch probe's child has exited, so its own CUDA
    context is not counted as someone else's work."""
    if nvml is None:
        try:
            nvml = load_nvml()
        except ImportError:
            return None
    try:
        nvml.nvmlInit()
    except Exception:
        return None
    try:
        counts: dict[int, int] = {}
        for i in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(i)
            procs = _optional(lambda h=handle: nvml.nvmlDeviceGetComputeRunningProcesses(h))
            if procs is not None:
                counts[i] = sum(1 for p in procs if getattr(p, "pid", None) not in own_pids)
        return counts
    except Exception:
        return None
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:
            pass


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
