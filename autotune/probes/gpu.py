"""NVIDIA GPUs: which ones a trial can use (torch's view), and NVML's details.

The devices a trial sees, their order and compute capability come from the
torch probe (``cuda_devices``): CUDA itself enumerates them there, honouring
CUDA_VISIBLE_DEVICES and MIG, and it works where libnvidia-ml is not mounted.
NVML adds what torch does not say (compute mode, MIG instances, links, other
processes) and is the fallback for documents without torch's list.

NVML is passed in (``nvml=``) rather than imported at module level so
tests can hand in a fake, and so importing ``probes`` never loads
libnvidia-ml.  Every NVML failure degrades to an empty list plus a reason:
a probe must describe a GPU-less machine, not crash on it.
"""
from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._machine import Machine

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


@dataclass
class GpuInfo:
    index: int
    name: str
    memory_bytes: int | None = None
    compute_capability: str | None = None
    uuid: str | None = None
    pci_bus_id: str | None = None
    compute_mode: str | None = None  # COMPUTE_MODE_NAMES; None when NVML could not say
    mig: bool = False
    # A MIG-enabled GPU's instances, {"index", "uuid", "name", "memory_bytes"} each:
    # CUDA_VISIBLE_DEVICES names them by their MIG-... UUIDs.
    mig_devices: list[dict[str, Any]] = field(default_factory=list)
    processes: int | None = None  # compute processes NVML saw on it, None when unknown

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


def torch_device(raw: Mapping[str, Any]) -> dict[str, Any]:
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
    return {
        "name": name,
        "compute_capability": raw.get("compute_capability"),
        "memory_bytes": int(memory) if isinstance(memory, (int, float)) else None,
        "uuid": cuda_uuid(raw.get("uuid"), mig=is_mig_name(name)),
        "pci_bus_id": pci_bus_id,
    }


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


def _mig_devices(nvml: Any, handle: Any) -> list[dict[str, Any]]:
    """The MIG devices that exist under a MIG-enabled GPU.  Slots up to the maximum
    may be empty (NVML_ERROR_NOT_FOUND): those are skipped."""
    found: list[dict[str, Any]] = []
    for slot in range(_optional(lambda: nvml.nvmlDeviceGetMaxMigDeviceCount(handle)) or 0):
        mig = _optional(lambda s=slot: nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, s))
        if mig is None:
            continue
        memory = _optional(lambda m=mig: nvml.nvmlDeviceGetMemoryInfo(m).total)
        found.append({
            "index": slot,
            "uuid": _optional(lambda m=mig: decode(nvml.nvmlDeviceGetUUID(m))),
            "name": _optional(lambda m=mig: decode(nvml.nvmlDeviceGetName(m))),
            "memory_bytes": int(memory) if memory is not None else None,
        })
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


# ---------------------------------------------------------------- the GPUs a trial sees

_UUID_PREFIXES = ("GPU-", "MIG-")


def _mig_instance(parent: GpuInfo, device: Mapping[str, Any]) -> GpuInfo:
    """A MIG device of ``parent`` as CUDA shows it (index stays the parent's NVML index)."""
    return dataclasses.replace(
        parent, name=device.get("name") or parent.name, memory_bytes=device.get("memory_bytes"),
        uuid=device.get("uuid"), mig=True, mig_devices=[])


def _as_enumerated(gpu: GpuInfo) -> GpuInfo | None:
    """What CUDA enumerates for an NVML GPU: the GPU, or for a MIG-enabled one its first
    MIG device (None when it has none)."""
    if not gpu.mig:
        return gpu
    return _mig_instance(gpu, gpu.mig_devices[0]) if gpu.mig_devices else None


def _one_mig(devices: list[tuple[GpuInfo, int | None]]) -> list[tuple[GpuInfo, int | None]]:
    """NVIDIA's MIG user guide: a CUDA process enumerates a single MIG device, however
    many are created or listed in CUDA_VISIBLE_DEVICES; the first one is kept."""
    out, seen_mig = [], False
    for gpu, parent in devices:
        if gpu.mig:
            if seen_mig:
                continue
            seen_mig = True
        out.append((gpu, parent))
    return out


def _entries(cuda_visible_devices: str) -> list[str]:
    return [e.strip() for e in cuda_visible_devices.split(",")]


def _nvml_match(gpus: Sequence[GpuInfo], entry: str) -> tuple[GpuInfo, int] | None:
    """The device an entry of CUDA_VISIBLE_DEVICES names among NVML's GPUs (an index,
    a GPU-... UUID prefix, or a MIG-... UUID prefix of one of their MIG devices), and its
    parent's NVML index."""
    if not entry:
        return None
    if entry.startswith("MIG-"):
        for g in gpus:
            for device in g.mig_devices:
                if (device.get("uuid") or "").startswith(entry):
                    return _mig_instance(g, device), g.index
        return None
    if entry.startswith("GPU-"):
        parent = next((g for g in gpus if (g.uuid or "").startswith(entry)), None)
    else:
        parent = next((g for g in gpus if str(g.index) == entry), None)
    shown = _as_enumerated(parent) if parent is not None else None
    return (shown, parent.index) if shown is not None and parent is not None else None


def visible_gpus(gpus: Sequence[GpuInfo],
                 cuda_visible_devices: str | None) -> tuple[list[GpuInfo], list[str]]:
    """From NVML's list alone: the GPUs torch will see, in its order, and the NVML indices
    of those it will not.  CUDA_VISIBLE_DEVICES (indices or UUIDs, comma separated; the
    list ends at the first entry that names no GPU, as CUDA reads it) narrows them, and an
    empty value hides all.  A MIG-enabled GPU shows as one of its MIG devices, and only
    one MIG device in all.  Each GpuInfo keeps its NVML index."""
    picked = _visible(gpus, cuda_visible_devices)
    hidden = [] if cuda_visible_devices is None else _hidden(gpus, picked)
    return [g for g, _ in picked], hidden


def _visible(gpus: Sequence[GpuInfo], cuda_visible_devices: str | None) -> list[tuple[GpuInfo, int | None]]:
    if cuda_visible_devices is None:
        shown = ((_as_enumerated(g), g.index) for g in gpus)
        return _one_mig([(g, i) for g, i in shown if g is not None])
    picked: list[tuple[GpuInfo, int | None]] = []
    for entry in _entries(cuda_visible_devices):
        match = _nvml_match(gpus, entry)
        if match is None or match in picked:
            break
        picked.append(match)
    return _one_mig(picked)


def _hidden(gpus: Sequence[GpuInfo], picked: Sequence[tuple[GpuInfo, int | None]]) -> list[str]:
    shown = {parent for _, parent in picked}
    return [str(g.index) for g in gpus if g.index not in shown]


def _parent(device: Mapping[str, Any], gpus: Sequence[GpuInfo]) -> GpuInfo | None:
    """NVML's GPU behind one of torch's devices: by UUID (its own or one of its MIG
    devices'), else by PCI bus id, which MIG devices share with their parent."""
    uuid = device.get("uuid")
    if uuid:
        for g in gpus:
            if g.uuid == uuid or any(m.get("uuid") == uuid for m in g.mig_devices):
                return g
    key = pci_key(device.get("pci_bus_id"))
    if key is not None:
        return next((g for g in gpus if pci_key(g.pci_bus_id) == key), None)
    return None


def _merged(device: Mapping[str, Any], gpus: Sequence[GpuInfo]) -> tuple[GpuInfo, int | None]:
    """One of torch's devices with NVML's details, and its parent's NVML index."""
    parent = _parent(device, gpus)
    uuid = device.get("uuid")
    mig = (uuid or "").startswith("MIG-") or is_mig_name(device.get("name"))
    instance = next((m for m in (parent.mig_devices if parent else []) if uuid and m.get("uuid") == uuid), None)
    memory = device.get("memory_bytes")
    if memory is None:
        # A MIG device's memory is its slice's, never its parent's.
        memory = instance.get("memory_bytes") if instance else (parent.memory_bytes if parent and not mig else None)
    info = GpuInfo(
        index=-1,
        name=device.get("name") or (instance or {}).get("name") or (parent.name if parent else "unknown"),
        memory_bytes=memory,
        compute_capability=device.get("compute_capability") or (parent.compute_capability if parent else None),
        uuid=uuid or (parent.uuid if parent and not mig else None),
        pci_bus_id=device.get("pci_bus_id") or (parent.pci_bus_id if parent else None),
        compute_mode=parent.compute_mode if parent else None,
        mig=mig or bool(parent and parent.mig),
        processes=parent.processes if parent else None,
    )
    return info, parent.index if parent else None


def _narrowed(listed: list[tuple[GpuInfo, int | None]], gpus: Sequence[GpuInfo], *,
              recorded: str | None, current: str) -> list[tuple[GpuInfo, int | None]]:
    """Torch's list, seen under ``recorded``, narrowed to what ``current`` shows.  An index
    names a position of the recorded list when the probe saw every device, else the entry
    the recorded value had in that place; a UUID names a device by its prefix.  A device
    the probe did not see is taken from NVML, when NVML lists it."""
    recorded_entries = _entries(recorded) if recorded is not None else None
    picked: list[tuple[GpuInfo, int | None]] = []
    for entry in _entries(current):
        match: tuple[GpuInfo, int | None] | None = None
        if entry.startswith(_UUID_PREFIXES):
            match = next(((g, p) for g, p in listed if (g.uuid or "").startswith(entry)), None)
        elif recorded_entries is None:
            if entry.isdigit() and int(entry) < len(listed):
                match = listed[int(entry)]
        elif entry in recorded_entries and recorded_entries.index(entry) < len(listed):
            match = listed[recorded_entries.index(entry)]
        if match is None and (nvml := _nvml_match(gpus, entry)) is not None:
            # Torch's details win where it listed the same device.
            match = next(((g, p) for g, p in listed if nvml[0].uuid and g.uuid == nvml[0].uuid), nvml)
        if match is None or match in picked:
            break
        picked.append(match)
    return _one_mig(picked)


def usable_gpus(machine: Machine, cuda_visible_devices: str | None) -> tuple[list[GpuInfo], list[str]]:
    """The CUDA devices a trial will see, in torch's order (GpuInfo.index = the cuda:N
    ordinal), NVML's details merged in; and the NVML indices hidden (for the 'hidden by
    CUDA_VISIBLE_DEVICES' reason).

    Torch's list (``machine.torch["cuda_devices"]``) is the truth where the probe
    recorded one: it is what CUDA enumerated, under MIG and without NVML.  It was
    taken under the CUDA_VISIBLE_DEVICES the probe saw; a different value now narrows
    it.  Documents without it (older ones, torch not probed) fall back to NVML's list.
    """
    torch = machine.torch or {}
    nvml = list(machine.gpus)
    recorded = torch.get("cuda_visible_devices")
    devices = [d for d in torch.get("cuda_devices") or [] if isinstance(d, Mapping)]
    probed = bool(torch.get("version"))
    # The probe's own CUDA_VISIBLE_DEVICES may be why torch saw nothing; only then
    # is its "unavailable" not the last word.
    probe_narrowed = recorded is not None and recorded != cuda_visible_devices
    if probed and not torch.get("cuda"):
        return [], _hidden_by(nvml, cuda_visible_devices)
    if probed and not torch.get("cuda_available") and not probe_narrowed:
        return [], _hidden_by(nvml, cuda_visible_devices)
    if devices:
        listed = [_merged(d, nvml) for d in devices]
        if cuda_visible_devices != recorded:
            if cuda_visible_devices is None:
                # The probe saw fewer than a trial will: only NVML knows the rest.
                listed = _visible(nvml, None) if nvml else listed
            else:
                listed = _narrowed(listed, nvml, recorded=recorded, current=cuda_visible_devices)
    else:
        listed = _visible(nvml, cuda_visible_devices)
    gpus = [dataclasses.replace(g, index=i) for i, (g, _) in enumerate(listed)]
    if cuda_visible_devices is None:
        return gpus, []
    if any(parent is None for _, parent in listed):
        # A device NVML does not know: which NVML GPUs it hides is NVML's reading.
        return gpus, _hidden_by(nvml, cuda_visible_devices)
    return gpus, _hidden(nvml, listed)


def _hidden_by(gpus: Sequence[GpuInfo], cuda_visible_devices: str | None) -> list[str]:
    return visible_gpus(gpus, cuda_visible_devices)[1]


def current_visible_devices() -> str | None:
    """This process's CUDA_VISIBLE_DEVICES: what the trials it starts inherit."""
    return os.environ.get("CUDA_VISIBLE_DEVICES")
