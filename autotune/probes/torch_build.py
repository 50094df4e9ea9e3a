"""The probe document's torch section: the build the trials run with and the devices CUDA
enumerated for it (read in a child interpreter by ``probes.torch_probe``)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from pydantic import Field

# A note left out of the document where there is none (pydantic's writer: ``schemas.typed``).
_WrittenIfSet = Annotated[str | None, Field(exclude_if=lambda v: v is None)]


@dataclass(frozen=True)
class TorchDevice:
    """One device CUDA enumerated for the torch probe, cuda:0 first: its UUID as
    nvidia-smi prints it and CUDA_VISIBLE_DEVICES takes it ("GPU-…", "MIG-…"), its bus id
    as NVML spells it (``gpu.torch_device`` makes one from the child's raw entry)."""

    name: str | None = None
    compute_capability: str | None = None
    memory_bytes: int | None = None
    uuid: str | None = None
    pci_bus_id: str | None = None


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
    error: _WrittenIfSet = None  # why torch could not be read; written only when there is one
    cuda_error: _WrittenIfSet = None  # why CUDA's devices could not be listed; likewise
