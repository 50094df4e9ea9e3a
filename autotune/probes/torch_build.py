"""The probe document's torch section: the build the trials run with and the devices CUDA
enumerated for it (read in a child interpreter by ``probes.torch_probe``)."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from autotune.runtime.json_value import JsonObject


@dataclass(frozen=True)
class TorchDevice:
    """One device CUDA enumerated for the torch probe, cuda:0 first: its UUID as
    nvidia-smi prints it and CUDA_VISIBLE_DEVICES takes it ("GPU-…", "MIG-…"), its bus id
    as NVML spells it (``gpu.torch_device`` makes one from the child's raw entry)."""

    name: str | None
    compute_capability: str | None = None
    memory_bytes: int | None = None
    uuid: str | None = None
    pci_bus_id: str | None = None

    def to_json(self) -> JsonObject:
        return {"name": self.name, "compute_capability": self.compute_capability,
                "memory_bytes": self.memory_bytes, "uuid": self.uuid, "pci_bus_id": self.pci_bus_id}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> TorchDevice:
        return cls(name=doc.get("name"), compute_capability=doc.get("compute_capability"),
                   memory_bytes=doc.get("memory_bytes"), uuid=doc.get("uuid"), pci_bus_id=doc.get("pci_bus_id"))


@dataclass(frozen=True)
class TorchBuild:
    """What the torch probe learnt; the defaults are what a probe that learnt nothing says
    (torch missing, not probed, or a document written without them)."""

    version: str | None = None
    cuda: str | None = None  # the CUDA torch was built with; None for a CPU-only or ROCm build
    hip: str | None = None
    cudnn: str | None = None
    cuda_available: bool = False
    cuda_device_count: int = 0
    cuda_devices: tuple[TorchDevice, ...] = ()
    mkldnn: bool | None = None
    openmp: bool | None = None
    num_threads: int | None = None
    # CUDA_VISIBLE_DEVICES as the probe's child saw it: the devices above are its view.
    cuda_visible_devices: str | None = None
    error: str | None = None  # why torch could not be read; written only when there is one
    cuda_error: str | None = None  # why CUDA's devices could not be listed; likewise

    def to_json(self) -> JsonObject:
        doc: JsonObject = {
            "version": self.version, "cuda": self.cuda, "hip": self.hip, "cudnn": self.cudnn,
            "cuda_available": self.cuda_available, "cuda_device_count": self.cuda_device_count,
            "cuda_devices": [d.to_json() for d in self.cuda_devices],
            "mkldnn": self.mkldnn, "openmp": self.openmp, "num_threads": self.num_threads,
            "cuda_visible_devices": self.cuda_visible_devices,
        }
        if self.error is not None:
            doc["error"] = self.error
        if self.cuda_error is not None:
            doc["cuda_error"] = self.cuda_error
        return doc

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> TorchBuild:
        """From a probe document's section, or the torch child's record; what it lacks
        reads as not learnt."""
        default = cls()
        return cls(
            version=doc.get("version"), cuda=doc.get("cuda"), hip=doc.get("hip"), cudnn=doc.get("cudnn"),
            cuda_available=doc.get("cuda_available", default.cuda_available),
            cuda_device_count=doc.get("cuda_device_count", default.cuda_device_count),
            cuda_devices=tuple(TorchDevice.from_json(d) for d in doc.get("cuda_devices") or []
                               if isinstance(d, Mapping)),
            mkldnn=doc.get("mkldnn"), openmp=doc.get("openmp"), num_threads=doc.get("num_threads"),
            cuda_visible_devices=doc.get("cuda_visible_devices"),
            error=doc.get("error"), cuda_error=doc.get("cuda_error"),
        )
