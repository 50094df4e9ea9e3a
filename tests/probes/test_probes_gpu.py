from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from autotune.probes import MachineProbe, fingerprint, gpu, probe_machine

FIXTURES = Path(__file__).parent / "fixtures"
GiB = 1 << 30


class FakeNVMLError(Exception):
    pass


class FakeNVML:
    """Just enough of pynvml's surface for two H100s on NVLink."""

    NVMLError = FakeNVMLError

    def __init__(self, count: int = 2, *, topology_supported: bool = False) -> None:
        self.count = count
        self.topology_supported = topology_supported
        self.shutdown_called = False

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        self.shutdown_called = True

    def nvmlSystemGetDriverVersion(self) -> bytes:
        return b"550.54.15"  # old bindings return bytes

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return 12040

    def nvmlDeviceGetCount(self) -> int:
        return self.count

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        return ("handle", index)

    def nvmlDeviceGetName(self, handle: Any) -> str:
        return "NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any:
        return SimpleNamespace(total=80 * GiB, free=79 * GiB, used=GiB)

    def nvmlDeviceGetCudaComputeCapability(self, handle: Any) -> tuple[int, int]:
        return (9, 0)

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        return f"GPU-0000-{handle[1]}"

    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any:
        return SimpleNamespace(busId=f"00000000:{0x18 + handle[1]:02X}:00.0".encode())

    def nvmlDeviceGetP2PStatus(self, a: Any, b: Any, index: int) -> int:
        return gpu.P2P_STATUS_OK

    def nvmlDeviceGetTopologyCommonAncestor(self, a: Any, b: Any) -> int:
        if not self.topology_supported:
            raise FakeNVMLError("Not Supported")
        return 40


class MissingLibraryNVML:
    """pynvml when libnvidia-ml.so is absent: nvmlInit raises."""

    def nvmlInit(self) -> None:
        import pynvml

        raise pynvml.NVMLError_LibraryNotFound()


def test_no_nvml_library_gives_empty_list_and_reason() -> None:
    result = gpu.read_gpus(MissingLibraryNVML())
    assert result.gpus == [] and result.links == []
    assert result.error and "NVML unavailable" in result.error and "LibraryNotFound" in result.error


def test_pynvml_not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_pynvml() -> None:
        raise ImportError("No module named 'pynvml'")

    monkeypatch.setattr(gpu, "load_nvml", no_pynvml)
    result = gpu.read_gpus()
    assert result.gpus == [] and "pynvml not installed" in (result.error or "")


def test_fake_nvml_two_gpus() -> None:
    fake = FakeNVML(2)
    result = gpu.read_gpus(fake)
    assert result.error is None
    assert [g.index for g in result.gpus] == [0, 1]
    first = result.gpus[0]
    assert first.name == "NVIDIA H100 80GB HBM3"
    assert first.memory_bytes == 80 * GiB
    assert first.compute_capability == "9.0"
    assert first.pci_bus_id == "00000000:18:00.0"
    assert result.driver == {"version": "550.54.15", "cuda_driver_version": "12.4"}
    # One pair; the unsupported topology query only blanks that field.
    assert [(k.a, k.b, k.p2p, k.nvlink, k.topology) for k in result.links] == [(0, 1, "ok", True, None)]
    assert fake.shutdown_called


def test_topology_names() -> None:
    link = gpu.read_gpus(FakeNVML(2, topology_supported=True)).links[0]
    assert link.topology == "NODE"


def test_query_failure_after_init_is_reported() -> None:
    class Broken(FakeNVML):
        def nvmlDeviceGetCount(self) -> int:
            raise FakeNVMLError("Unknown Error")

    result = gpu.read_gpus(Broken())
    assert result.gpus == [] and "Unknown Error" in (result.error or "")


def test_fake_root_with_fake_nvml_in_document() -> None:
    probe = probe_machine(root=str(FIXTURES / "intel_spr_2s"), nvml=FakeNVML(2))
    doc = probe.to_dict()
    assert doc["gpu_error"] is None
    assert [g["compute_capability"] for g in doc["gpus"]] == ["9.0", "9.0"]
    assert doc["gpu_links"][0]["nvlink"] is True
    fp = fingerprint(doc)
    assert fp["gpu_count"] == 2 and fp["gpu_names"] == ["NVIDIA H100 80GB HBM3"] * 2
    assert MachineProbe.from_dict(doc).to_dict() == doc


def test_fake_root_without_nvml_does_not_probe_host_gpus() -> None:
    doc = probe_machine(root=str(FIXTURES / "arm_graviton3")).to_dict()
    assert doc["gpus"] == [] and "not probed" in doc["gpu_error"]


def test_cross_check_with_torch() -> None:
    gpus = gpu.read_gpus(FakeNVML(2)).gpus
    cpu_build = gpu.cross_check_torch(
        gpus, torch_cuda_build=None, torch_cuda_available=False, torch_device_count=0, cuda_visible_devices=None
    )
    assert cpu_build and "CPU-only" in cpu_build[0]
    mismatch = gpu.cross_check_torch(
        gpus, torch_cuda_build="12.4", torch_cuda_available=True, torch_device_count=1, cuda_visible_devices=None
    )
    assert mismatch and "torch sees 1" in mismatch[0]
    # CUDA_VISIBLE_DEVICES explains a smaller torch count.
    assert not gpu.cross_check_torch(
        gpus, torch_cuda_build="12.4", torch_cuda_available=True, torch_device_count=1, cuda_visible_devices="0"
    )
    assert not gpu.cross_check_torch(
        gpus, torch_cuda_build="12.4", torch_cuda_available=True, torch_device_count=2, cuda_visible_devices=None
    )


def test_cuda_driver_version_format() -> None:
    assert gpu.format_cuda_driver_version(12040) == "12.4"
    assert gpu.format_cuda_driver_version(11080) == "11.8"
    assert gpu.format_cuda_driver_version(None) is None


@pytest.mark.gpu
def test_real_nvml_sees_gpus() -> None:
    result = gpu.read_gpus()
    assert result.error is None
    assert result.gpus and all(g.memory_bytes and g.compute_capability for g in result.gpus)
    assert result.driver["version"]
