from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from autotune.probes import Machine, cuda_visible, fingerprint, gpu, nvml, probe_machine
from autotune.probes.torch_build import TorchBuild
from autotune.schemas import typed

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
        return nvml.P2P_STATUS_OK

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
    result = nvml.read_gpus(MissingLibraryNVML())
    assert result.gpus == [] and result.links == []
    assert result.error and "NVML unavailable" in result.error and "LibraryNotFound" in result.error


def test_pynvml_not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_pynvml() -> None:
        raise ImportError("No module named 'pynvml'")

    monkeypatch.setattr(nvml, "load_nvml", no_pynvml)
    result = nvml.read_gpus()
    assert result.gpus == [] and "pynvml not installed" in (result.error or "")


def test_fake_nvml_two_gpus() -> None:
    fake = FakeNVML(2)
    result = nvml.read_gpus(fake)
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
    link = nvml.read_gpus(FakeNVML(2, topology_supported=True)).links[0]
    assert link.topology == "NODE"


def test_query_failure_after_init_is_reported() -> None:
    class Broken(FakeNVML):
        def nvmlDeviceGetCount(self) -> int:
            raise FakeNVMLError("Unknown Error")

    result = nvml.read_gpus(Broken())
    assert result.gpus == [] and "Unknown Error" in (result.error or "")


def test_fake_root_with_fake_nvml_in_document() -> None:
    probe = probe_machine(root=str(FIXTURES / "intel_spr_2s"), nvml=FakeNVML(2))
    doc = probe.to_json()
    assert doc["gpu_error"] is None
    assert [g["compute_capability"] for g in doc["gpus"]] == ["9.0", "9.0"]
    assert doc["gpu_links"][0]["nvlink"] is True
    fp = fingerprint(doc)
    assert fp["gpu_count"] == 2 and fp["gpu_names"] == ["NVIDIA H100 80GB HBM3"] * 2
    assert Machine.from_json(doc).to_json() == doc


def test_fake_root_without_nvml_does_not_probe_host_gpus() -> None:
    doc = probe_machine(root=str(FIXTURES / "arm_graviton3")).to_json()
    assert doc["gpus"] == [] and "not probed" in doc["gpu_error"]


def test_cross_check_with_torch() -> None:
    gpus = nvml.read_gpus(FakeNVML(2)).gpus
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
    result = nvml.read_gpus()
    assert result.error is None
    assert result.gpus and all(g.memory_bytes and g.compute_capability for g in result.gpus)
    assert result.driver["version"]


# ---------------------------------------------------------------- NVML: compute mode, MIG, processes

MACHINES = Path(__file__).parent.parent / "fixtures" / "machines"
PARENT_UUIDS = ["GPU-6f1d2c3b-8a4e-4b7f-9c2d-1e3f5a7b9c0d", "GPU-0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d"]
MIG_UUIDS = {0: ["MIG-11111111-2222-4333-8444-555555555555", "MIG-66666666-7777-4888-9999-aaaaaaaaaaaa"],
             1: ["MIG-bbbbbbbb-cccc-4ddd-8eee-ffffffffffff"]}


class FakeMigNVML(FakeNVML):
    """Two H100s in MIG mode: GPU 0 split into two 3g.40gb devices (slot 1 empty), GPU 1
    into one; GPU 1 is in EXCLUSIVE_PROCESS compute mode and runs someone's process."""

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        if handle[0] == "mig":
            return MIG_UUIDS[handle[1]][handle[2]]
        return PARENT_UUIDS[handle[1]]

    def nvmlDeviceGetName(self, handle: Any) -> str:
        return "NVIDIA H100 80GB HBM3" + (" MIG 3g.40gb" if handle[0] == "mig" else "")

    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any:
        return SimpleNamespace(total=(40 if handle[0] == "mig" else 80) * GiB)

    def nvmlDeviceGetComputeMode(self, handle: Any) -> int:
        return 3 if handle[1] == 1 else 0

    def nvmlDeviceGetMigMode(self, handle: Any) -> tuple[int, int]:
        return (1, 1)

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Any) -> int:
        return 3

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, slot: int) -> Any:
        # Slots are not packed: NVML answers NOT_FOUND for an empty one.
        slots = {0: {0: 0, 2: 1}, 1: {0: 0}}[handle[1]]
        if slot not in slots:
            raise FakeNVMLError("Not Found")
        return ("mig", handle[1], slots[slot])

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        return [SimpleNamespace(pid=4242, usedGpuMemory=GiB)] if handle[1] == 1 else []


def test_nvml_reads_compute_mode_and_mig_devices() -> None:
    result = nvml.read_gpus(FakeMigNVML(2))
    first, second = result.gpus
    assert (first.compute_mode, second.compute_mode) == ("default", "exclusive_process")
    assert first.mig and second.mig
    assert [m.uuid for m in first.mig_devices] == MIG_UUIDS[0]
    assert [m.index for m in first.mig_devices] == [0, 2]
    assert first.mig_devices[0].memory_bytes == 40 * GiB
    assert first.mig_devices[0].name == "NVIDIA H100 80GB HBM3 MIG 3g.40gb"


def test_a_gpu_without_mig_or_compute_mode_support_reads_as_plain() -> None:
    first = nvml.read_gpus(FakeNVML(1)).gpus[0]  # the fake has neither query: NotSupported
    assert first.compute_mode is None and first.mig is False and first.mig_devices == []


def test_other_processes_on_the_gpus_are_counted_but_not_ours() -> None:
    assert nvml.read_gpu_processes(FakeMigNVML(2)) == {0: 0, 1: 1}
    assert nvml.read_gpu_processes(FakeMigNVML(2), own_pids=(4242,)) == {0: 0, 1: 0}
    assert nvml.read_gpu_processes(MissingLibraryNVML()) is None


def test_the_probe_counts_processes_and_warns_when_gpus_are_busy() -> None:
    doc = probe_machine(root=str(FIXTURES / "intel_spr_2s"), nvml=FakeMigNVML(2)).to_json()
    assert [g["processes"] for g in doc["gpus"]] == [0, 1]
    assert any("other processes compute on GPU 1 (1)" in w for w in doc["warnings"])
    assert Machine.from_json(doc).to_json() == doc


# ---------------------------------------------------------------- torch's devices

def test_torch_device_entries_take_nvidia_smis_uuid_and_nvmls_bus_id() -> None:
    raw = {"name": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0", "memory_bytes": 85520809984,
           "uuid": "6f1d2c3b-8a4e-4b7f-9c2d-1e3f5a7b9c0d", "pci": [0, 0x18, 0]}
    assert typed.written(gpu.torch_device(raw)) == {
        "name": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0", "memory_bytes": 85520809984,
        "uuid": "GPU-6f1d2c3b-8a4e-4b7f-9c2d-1e3f5a7b9c0d", "pci_bus_id": "00000000:18:00.0"}
    mig = gpu.torch_device({"name": "NVIDIA H100 80GB HBM3 MIG 3g.40gb", "uuid": "1111-22",
                            "pci": None, "pci_bus_id": "0000:9a:00.0"})  # cudaDeviceGetPCIBusId's form
    assert mig.uuid == "MIG-1111-22" and mig.pci_bus_id == "00000000:9A:00.0"
    assert gpu.torch_device({"name": "x"}).uuid is None


def test_bus_ids_compare_across_spellings() -> None:
    assert gpu.pci_key("00000000:18:00.0") == gpu.pci_key("0000:18:00.0") == gpu.pci_key("0000:18:00.0 ")
    assert gpu.pci_key("00000000:1a:00.0") == gpu.pci_key("00000000:1A:00.0")
    assert gpu.pci_key("not a bus id") is None and gpu.pci_key(None) is None


def test_the_torch_probes_devices_are_written_as_the_document_keeps_them() -> None:
    from autotune.probes import torch_probe

    line = ('{"kind": "torch", "version": "2.13.0+cu130", "cuda": "13.0", "cuda_available": true, '
            '"cuda_device_count": 1, "cuda_visible_devices": "MIG-1111", "cuda_devices": [{"name": '
            '"NVIDIA H100 80GB HBM3 MIG 3g.40gb", "compute_capability": "9.0", "memory_bytes": 1, '
            '"uuid": "1111-2222", "pci": [0, 24, 0]}]}')
    torch = typed.written(torch_probe.parse_torch_probe_output(line, returncode=0).torch)
    assert torch["cuda_visible_devices"] == "MIG-1111"
    assert torch["cuda_devices"] == [{"name": "NVIDIA H100 80GB HBM3 MIG 3g.40gb", "compute_capability": "9.0",
                                      "memory_bytes": 1, "uuid": "MIG-1111-2222",
                                      "pci_bus_id": "00000000:18:00.0"}]


# ---------------------------------------------------------------- usable_gpus

def machine_fixture(name: str) -> Machine:
    import json

    return Machine.from_json(json.loads((MACHINES / f"{name}.json").read_text()))


def test_the_h100_fixtures_agree_with_themselves() -> None:
    """Synthetic, but consistent: torch's devices are NVML's GPUs (or MIG devices) by UUID and
    bus id, and every fixture loads."""
    for name in ("h100x1", "h100x8", "h100x8_mig", "h100x8_exclusive"):
        machine = machine_fixture(name)
        nvml_ids = {g.pci_bus_id for g in machine.gpus}
        uuids = {g.uuid for g in machine.gpus} | {m.uuid for g in machine.gpus for m in g.mig_devices}
        devices = machine.torch.cuda_devices
        assert devices and machine.torch.cuda_device_count == len(devices)
        assert all(d.pci_bus_id in nvml_ids and d.uuid in uuids for d in devices), name
        assert all(re.fullmatch(r"(GPU|MIG)-[0-9a-f]{8}-([0-9a-f]{4}-){3}[0-9a-f]{12}", u) for u in uuids)


@pytest.mark.parametrize(("name", "count", "mode"), [
    ("h100x1", 1, "default"), ("h100x8", 8, "default"), ("h100x8_exclusive", 8, "exclusive_process")])
def test_usable_gpus_are_torchs_devices_with_nvmls_details(name: str, count: int, mode: str) -> None:
    machine = machine_fixture(name)
    gpus, hidden = cuda_visible.usable_gpus(machine, None)
    assert [g.index for g in gpus] == list(range(count)) and hidden == []
    assert all(g.compute_mode == mode and g.compute_capability == "9.0" and not g.mig for g in gpus)
    assert [g.uuid for g in gpus] == [g.uuid for g in machine.gpus]
    assert gpus[0].memory_bytes == 85520809984  # torch's figure: what can be allocated


def test_without_nvml_the_gpus_come_from_torch() -> None:
    """C6: a container without libnvidia-ml still tunes on its GPUs."""
    machine = machine_fixture("h100x8")
    machine.gpus, machine.gpu_links, machine.gpu_error = [], [], "NVML unavailable: LibraryNotFound"
    gpus, hidden = cuda_visible.usable_gpus(machine, None)
    assert len(gpus) == 8 and hidden == [] and gpus[3].compute_capability == "9.0"
    assert cuda_visible.usable_gpus(machine, "2,3")[0] == [dataclasses.replace(gpus[2], index=0),
                                                  dataclasses.replace(gpus[3], index=1)]


def test_a_mig_machine_offers_the_one_mig_device_cuda_enumerates() -> None:
    """C6: without CUDA_VISIBLE_DEVICES, CUDA enumerates one MIG device, with its slice's
    memory, not the eight parents."""
    machine = machine_fixture("h100x8_mig")
    gpus, hidden = cuda_visible.usable_gpus(machine, None)
    assert len(gpus) == 1 and hidden == []
    assert gpus[0].mig and gpus[0].uuid == machine.gpus[0].mig_devices[0].uuid
    assert gpus[0].memory_bytes is not None and gpus[0].memory_bytes < 45 * 10**9


def test_a_mig_uuid_in_cuda_visible_devices_names_that_mig_device() -> None:
    """C6: CUDA_VISIBLE_DEVICES=MIG-... used to match no GPU and tune on CPU."""
    machine = machine_fixture("h100x8_mig")
    wanted = machine.gpus[3].mig_devices[1].uuid
    gpus, hidden = cuda_visible.usable_gpus(machine, wanted[:13])  # a prefix, as CUDA accepts it
    assert [g.uuid for g in gpus] == [wanted] and gpus[0].index == 0
    assert hidden == ["0", "1", "2", "4", "5", "6", "7"]
    # however many MIG devices are listed, a CUDA process sees the first
    other = machine.gpus[5].mig_devices[0].uuid
    assert [g.uuid for g in cuda_visible.usable_gpus(machine, f"{wanted},{other}")[0]] == [wanted]
    # a MIG-… entry naming nothing hides everything
    assert cuda_visible.usable_gpus(machine, "MIG-00000000")[0] == []


@pytest.mark.parametrize(("visible", "expected", "hidden"), [
    ("2,0", [2, 0], ["1", "3", "4", "5", "6", "7"]),
    ("", [], ["0", "1", "2", "3", "4", "5", "6", "7"]),
    ("1,7,-1,2", [1, 7], ["0", "2", "3", "4", "5", "6"]),  # CUDA stops at an entry naming nothing
    ("1,1,2", [1], ["0", "2", "3", "4", "5", "6", "7"]),
    ("9", [], ["0", "1", "2", "3", "4", "5", "6", "7"]),
])
def test_cuda_visible_devices_narrows_torchs_list(visible: str, expected: list[int], hidden: list[str]) -> None:
    machine = machine_fixture("h100x8")
    gpus, got_hidden = cuda_visible.usable_gpus(machine, visible)
    assert [g.uuid for g in gpus] == [machine.gpus[i].uuid for i in expected]
    assert [g.index for g in gpus] == list(range(len(expected))) and got_hidden == hidden


def test_a_uuid_prefix_names_a_gpu() -> None:
    machine = machine_fixture("h100x8")
    gpus, hidden = cuda_visible.usable_gpus(machine, machine.gpus[5].uuid[:10])
    assert [g.uuid for g in gpus] == [machine.gpus[5].uuid] and hidden == ["0", "1", "2", "3", "4", "6", "7"]


def test_a_probe_taken_under_cuda_visible_devices_is_read_in_its_terms() -> None:
    """The probe saw GPUs 4 and 5 as cuda:0 and cuda:1; "5" now is the second of them, and
    with no CUDA_VISIBLE_DEVICES a trial sees all eight (NVML's list)."""
    machine = machine_fixture("h100x8")
    devices = machine.torch.cuda_devices
    machine.torch = dataclasses.replace(machine.torch, cuda_visible_devices="4,5", cuda_device_count=2,
                                        cuda_devices=devices[4:6])
    assert [g.uuid for g in cuda_visible.usable_gpus(machine, "4,5")[0]] == [devices[4].uuid, devices[5].uuid]
    assert [g.uuid for g in cuda_visible.usable_gpus(machine, "5")[0]] == [devices[5].uuid]
    assert [g.uuid for g in cuda_visible.usable_gpus(machine, "0")[0]] == [devices[0].uuid]  # from NVML
    assert len(cuda_visible.usable_gpus(machine, None)[0]) == 8


def test_cuda_unusable_by_torch_means_no_gpus() -> None:
    machine = machine_fixture("h100x8")
    machine.torch = dataclasses.replace(machine.torch, cuda_available=False, cuda_device_count=0, cuda_devices=())
    assert cuda_visible.usable_gpus(machine, None) == ([], [])
    assert cuda_visible.usable_gpus(machine, "0,1")[1] == ["2", "3", "4", "5", "6", "7"]
    machine.torch = dataclasses.replace(machine.torch, cuda=None)  # a CPU-only build
    assert cuda_visible.usable_gpus(machine, None) == ([], [])


def test_a_cpu_machine_has_no_usable_gpus() -> None:
    for name in ("avx2_epyc", "amx_spr"):
        assert cuda_visible.usable_gpus(machine_fixture(name), None) == ([], [])
        assert cuda_visible.usable_gpus(machine_fixture(name), "0") == ([], [])


def test_documents_without_torchs_list_fall_back_to_nvml() -> None:
    machine = machine_fixture("h100x8")
    machine.torch = dataclasses.replace(machine.torch, cuda_devices=())  # as documents written before it
    gpus, hidden = cuda_visible.usable_gpus(machine, "2,3")
    assert [g.uuid for g in gpus] == [machine.gpus[2].uuid, machine.gpus[3].uuid]
    assert [g.index for g in gpus] == [0, 1] and hidden == ["0", "1", "4", "5", "6", "7"]
    machine.torch = TorchBuild()  # torch not probed at all
    assert len(cuda_visible.usable_gpus(machine, None)[0]) == 8


def test_visible_gpus_reads_nvmls_list_as_cuda_does() -> None:
    gpus = [gpu.GpuInfo(index=i, name="H100", uuid=f"GPU-{i}") for i in range(4)]
    assert cuda_visible.visible_gpus(gpus, None) == (gpus, [])
    assert cuda_visible.visible_gpus(gpus, "") == ([], ["0", "1", "2", "3"])
    assert cuda_visible.visible_gpus(gpus, "2,0") == ([gpus[2], gpus[0]], ["1", "3"])
    assert cuda_visible.visible_gpus(gpus, "GPU-3") == ([gpus[3]], ["0", "1", "2"])
    assert cuda_visible.visible_gpus(gpus, "1,7,2") == ([gpus[1]], ["0", "2", "3"])
    assert cuda_visible.visible_gpus(gpus, "1,1,2") == ([gpus[1]], ["0", "2", "3"])


def test_visible_gpus_shows_a_mig_gpu_as_one_mig_device() -> None:
    found = nvml.read_gpus(FakeMigNVML(2)).gpus
    visible, hidden = cuda_visible.visible_gpus(found, None)
    assert [g.uuid for g in visible] == [MIG_UUIDS[0][0]] and hidden == []
    visible, hidden = cuda_visible.visible_gpus(found, MIG_UUIDS[1][0])
    assert [(g.uuid, g.compute_mode, g.memory_bytes) for g in visible] == [
        (MIG_UUIDS[1][0], "exclusive_process", 40 * GiB)]
    assert hidden == ["0"]


# ---------------------------------------------------------------- K1: the fingerprint counts what a trial sees

def test_the_fingerprint_counts_the_gpus_a_trial_sees(monkeypatch: pytest.MonkeyPatch) -> None:
    from autotune.probes import fingerprint_id

    doc = machine_fixture("h100x8").to_json()
    assert fingerprint(doc, cuda_visible_devices=None)["gpu_count"] == 8
    assert fingerprint(doc, cuda_visible_devices="0,1,2,3")["gpu_count"] == 4
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    narrowed = fingerprint_id(doc)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert fingerprint_id(doc) != narrowed  # a study tuned on eight is not resumed on four
    assert fingerprint(machine_fixture("h100x8_mig").to_json(), cuda_visible_devices=None)["gpu_count"] == 1


# ---------------------------------------------------------------- K7: /dev/shm and the printout

def test_shm_size_is_read_from_statvfs() -> None:
    from autotune.probes import host_memory

    assert host_memory.statvfs_size(SimpleNamespace(f_frsize=4096, f_blocks=16384)) == 64 << 20
    assert host_memory.statvfs_size(object()) is None
    seen = []

    def fake(path: str) -> Any:
        seen.append(path)
        return SimpleNamespace(f_frsize=4096, f_blocks=16384)

    assert host_memory.read_shm_bytes("/", statvfs=fake) == 64 << 20 and seen == ["/dev/shm"]
    assert host_memory.read_shm_bytes(str(FIXTURES / "intel_spr_2s"), statvfs=fake) is None  # no /dev/shm there


def test_a_small_dev_shm_and_busy_gpus_are_warned_about() -> None:
    from autotune.probes import render_text
    from autotune.probes._machine import resource_warnings
    from autotune.probes.host_memory import MemoryInfo

    small = MemoryInfo(total_bytes=None, available_bytes=None, cgroup_limit_bytes=None,
                       cgroup_usage_bytes=None, usable_bytes=None, shm_bytes=64 << 20)
    busy = [gpu.GpuInfo(index=0, name="H100", processes=0), gpu.GpuInfo(index=1, name="H100", processes=2)]
    warnings = resource_warnings(small, busy)
    assert len(warnings) == 2
    assert warnings[0].startswith("/dev/shm is 64 MiB") and "--shm-size" in warnings[0]
    assert "GPU 1 (2)" in warnings[1]
    assert resource_warnings(dataclasses.replace(small, shm_bytes=8 << 30), busy[:1]) == []
    assert resource_warnings(dataclasses.replace(small, shm_bytes=None), []) == []
    doc = machine_fixture("h100x8_mig").to_json()
    doc["warnings"] = warnings
    text = render_text(doc)
    assert "Warnings   /dev/shm is 64 MiB" in text
    assert "compute mode default, MIG on (2 instance(s))" in text
    assert "cuda:0 NVIDIA H100 80GB HBM3 MIG 3g.40gb" in text
    exclusive = render_text(machine_fixture("h100x8_exclusive").to_json())
    assert "compute mode exclusive_process" in exclusive


def test_the_cross_check_explains_mig_rather_than_a_missing_gpu() -> None:
    gpus = nvml.read_gpus(FakeMigNVML(2)).gpus
    warnings = gpu.cross_check_torch(gpus, torch_cuda_build="13.0", torch_cuda_available=True,
                                     torch_device_count=1, cuda_visible_devices=None)
    assert len(warnings) == 1 and warnings[0].startswith("MIG is on: a process sees one MIG device")
