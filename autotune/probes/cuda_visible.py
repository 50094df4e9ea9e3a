"""The GPUs a trial sees: torch's list where the probe recorded one, NVML's otherwise,
narrowed by CUDA_VISIBLE_DEVICES as CUDA reads it, one MIG device at most."""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence

from ._machine import Machine
from .gpu import GpuInfo, MigDevice, is_mig_name, pci_key
from .torch_build import TorchDevice

_UUID_PREFIXES = ("GPU-", "MIG-")


def _mig_instance(parent: GpuInfo, device: MigDevice) -> GpuInfo:
    """A MIG device of ``parent`` as CUDA shows it (index stays the parent's NVML index)."""
    return dataclasses.replace(
        parent, name=device.name or parent.name, memory_bytes=device.memory_bytes,
        uuid=device.uuid, mig=True, mig_devices=[])


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
                if (device.uuid or "").startswith(entry):
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


def _parent(device: TorchDevice, gpus: Sequence[GpuInfo]) -> GpuInfo | None:
    """NVML's GPU behind one of torch's devices: by UUID (its own or one of its MIG
    devices'), else by PCI bus id, which MIG devices share with their parent."""
    uuid = device.uuid
    if uuid:
        for g in gpus:
            if g.uuid == uuid or any(m.uuid == uuid for m in g.mig_devices):
                return g
    key = pci_key(device.pci_bus_id)
    if key is not None:
        return next((g for g in gpus if pci_key(g.pci_bus_id) == key), None)
    return None


def _merged(device: TorchDevice, gpus: Sequence[GpuInfo]) -> tuple[GpuInfo, int | None]:
    """One of torch's devices with NVML's details, and its parent's NVML index."""
    parent = _parent(device, gpus)
    uuid = device.uuid
    mig = (uuid or "").startswith("MIG-") or is_mig_name(device.name)
    instance = next((m for m in (parent.mig_devices if parent else []) if uuid and m.uuid == uuid), None)
    memory = device.memory_bytes
    if memory is None:
        # A MIG device's memory is its slice's, never its parent's.
        memory = instance.memory_bytes if instance else (parent.memory_bytes if parent and not mig else None)
    info = GpuInfo(
        index=-1,
        name=device.name or (instance.name if instance else None) or (parent.name if parent else "unknown"),
        memory_bytes=memory,
        compute_capability=device.compute_capability or (parent.compute_capability if parent else None),
        uuid=uuid or (parent.uuid if parent and not mig else None),
        pci_bus_id=device.pci_bus_id or (parent.pci_bus_id if parent else None),
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

    Torch's list (``machine.torch.cuda_devices``) is the truth where the probe
    recorded one: it is what CUDA enumerated, under MIG and without NVML.  It was
    taken under the CUDA_VISIBLE_DEVICES the probe saw; a different value now narrows
    it.  Documents without it (older ones, torch not probed) fall back to NVML's list.
    """
    torch = machine.torch
    nvml = list(machine.gpus)
    recorded = torch.cuda_visible_devices
    devices = torch.cuda_devices
    probed = bool(torch.version)
    # The probe's own CUDA_VISIBLE_DEVICES may be why torch saw nothing; only then
    # is its "unavailable" not the last word.
    probe_narrowed = recorded is not None and recorded != cuda_visible_devices
    if probed and not torch.cuda:
        return [], _hidden_by(nvml, cuda_visible_devices)
    if probed and not torch.cuda_available and not probe_narrowed:
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
