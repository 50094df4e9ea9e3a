from __future__ import annotations

from pathlib import Path

import pytest

from autotune.probes import cpu, cpu_text
from autotune.probes.cpu import CpuFallback, summarize_cpu, usable_core_count
from autotune.probes.cpu_text import (
    format_cpulist,
    isa_from_flags,
    parse_cpulist,
    parse_lscpu,
    parse_lscpu_cache,
    parse_proc_cpuinfo,
    parse_size,
    parse_status_cpus_allowed,
    summarize_cpuinfo,
)
from autotune.schemas import typed

FIXTURES = Path(__file__).parent / "fixtures"


def text(machine: str, rel: str) -> str:
    return (FIXTURES / machine / rel).read_text()


def summary_from_fixture(machine: str) -> cpu.CpuInfo:
    """Exercise the pure path: every source handed in as text."""
    nodes_dir = FIXTURES / machine / "sys/devices/system/node"
    node_cpulists = {
        int(p.name[4:]): (p / "cpulist").read_text() for p in nodes_dir.glob("node[0-9]*")
    }
    return summarize_cpu(
        cpuinfo_text=text(machine, "proc/cpuinfo"),
        lscpu_text=text(machine, "_commands/lscpu.txt"),
        node_cpulists=node_cpulists,
        affinity=parse_status_cpus_allowed(text(machine, "proc/self/status")),
    )


# ------------------------------------------------------------- cpulist

@pytest.mark.parametrize(
    "raw, expected",
    [
        ("0-3", [0, 1, 2, 3]),
        ("0-1,4,6-7\n", [0, 1, 4, 6, 7]),
        ("7", [7]),
        ("", []),
        ("\n", []),
        ("0-15,32-47", list(range(16)) + list(range(32, 48))),
    ],
)
def test_parse_cpulist(raw: str, expected: list[int]) -> None:
    assert parse_cpulist(raw) == expected


def test_format_cpulist_round_trips() -> None:
    ids = [0, 1, 2, 5, 7, 8, 9, 40]
    assert format_cpulist(ids) == "0-2,5,7-9,40"
    assert parse_cpulist(format_cpulist(ids)) == ids
    assert format_cpulist([]) == ""


def test_status_cpus_allowed_list() -> None:
    status = "Name:\tpython\nCpus_allowed:\tff\nCpus_allowed_list:\t0-3,6\nMems_allowed_list:\t0\n"
    assert parse_status_cpus_allowed(status) == [0, 1, 2, 3, 6]
    assert parse_status_cpus_allowed("Name:\tx\n") is None


# ------------------------------------------------------------- sizes

@pytest.mark.parametrize(
    "raw, expected",
    [("64 KiB", 65536), ("32K", 32768), ("1.5 MiB", 1572864), ("75 MiB", 75 << 20), ("2048", 2048), ("x", None)],
)
def test_parse_size(raw: str, expected: int | None) -> None:
    assert parse_size(raw) == expected


def test_lscpu_cache_new_and_old_formats() -> None:
    assert parse_lscpu_cache("1 MiB (2 instances)") == {"size_bytes": 524288, "instances": 2, "total_bytes": 1 << 20}
    assert parse_lscpu_cache("32 MiB (1 instance)")["size_bytes"] == 32 << 20
    # util-linux < 2.34 prints one instance's size with no count.
    assert parse_lscpu_cache("1024K") == {"size_bytes": 1 << 20, "instances": None, "total_bytes": None}


def test_lscpu_flat_and_tree_layouts_read_the_same() -> None:
    flat = parse_lscpu("L1d cache:   64 KiB (2 instances)\nModel name:  X\n")
    tree = parse_lscpu("Caches (sum of all):\n  L1d:    64 KiB (2 instances)\n  Model name:   X\n")
    assert flat["l1d"] == tree["l1d"] == ["64 KiB (2 instances)"]
    assert flat["model name"] == tree["model name"] == ["X"]


# ------------------------------------------------------------- ISA

def test_isa_x86_flags() -> None:
    isa = isa_from_flags(["fpu", "sse", "avx2", "avx512f", "avx512_bf16", "amx_tile"])
    assert isa["avx2"] and isa["avx512f"] and isa["avx512_bf16"] and isa["amx_tile"]
    assert not isa["amx_int8"] and not isa["avx512_fp16"] and not isa["neon"]


def test_isa_arm_features() -> None:
    isa = isa_from_flags(["fp", "asimd", "sve", "bf16", "i8mm"])
    assert isa["neon"] and isa["sve"] and isa["bf16"] and isa["i8mm"]
    assert not isa["sve2"] and not isa["avx2"]


def test_isa_has_the_same_keys_everywhere() -> None:
    assert set(isa_from_flags([])) == set(cpu_text.ISA_KEYS)
    assert not any(isa_from_flags([]).values())


# ------------------------------------------------------------- machines

def test_this_machine_fixture_epyc_kvm() -> None:
    info = summary_from_fixture("local_epyc_kvm")
    assert info.vendor == "AuthenticAMD"
    assert info.model == "AMD EPYC"
    assert (info.sockets, info.physical_cores, info.logical_cores) == (1, 2, 2)
    assert info.threads_per_core == 1
    assert info.numa_nodes == {0: [0, 1]}
    assert info.usable_cores == 2 and info.usable_cpus == [0, 1]
    assert info.isa["avx2"] and info.isa["fma"]
    assert not any(info.isa[f] for f in ("avx512f", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8"))
    assert info.caches["l2"] == {"size_bytes": 512 << 10, "instances": 2, "total_bytes": 1 << 20}
    assert info.caches["l3"]["size_bytes"] == 32 << 20


def test_intel_sapphire_rapids_two_sockets_with_ht() -> None:
    info = summary_from_fixture("intel_spr_2s")
    assert info.vendor == "GenuineIntel"
    assert info.model == "Intel(R) Xeon(R) Gold 6426Y"
    assert (info.sockets, info.physical_cores, info.logical_cores) == (2, 32, 64)
    assert info.threads_per_core == 2
    assert info.numa_nodes == {
        0: list(range(16)) + list(range(32, 48)),
        1: list(range(16, 32)) + list(range(48, 64)),
    }
    for flag in ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "avx512_vnni", "amx_tile", "amx_bf16", "amx_int8"):
        assert info.isa[flag], flag
    assert info.caches["l3"] == {"size_bytes": 75 << 19, "instances": 2, "total_bytes": 75 << 20}


def test_affinity_mask_smaller_than_the_machine() -> None:
    # The SPR fixture process was started with numactl --cpunodebind=0.
    info = summary_from_fixture("intel_spr_2s")
    assert info.usable_cores == 32
    assert info.usable_cpus == list(range(16)) + list(range(32, 48))
    assert info.usable_numa_nodes == {0: info.numa_nodes[0]}


def test_amd_genoa_nps4() -> None:
    info = summary_from_fixture("amd_genoa_nps4")
    assert info.model == "AMD EPYC 9354P 32-Core Processor"
    assert (info.sockets, info.physical_cores, info.logical_cores) == (1, 32, 64)
    assert sorted(info.numa_nodes) == [0, 1, 2, 3]
    assert info.numa_nodes[1] == list(range(8, 16)) + list(range(40, 48))
    assert info.isa["avx512f"] and info.isa["avx512_bf16"] and info.isa["avx512_vnni"]
    assert not info.isa["avx512_fp16"]
    assert not any(info.isa[f] for f in ("amx_tile", "amx_bf16", "amx_int8"))
    assert info.caches["l3"]["instances"] == 8


def test_arm_graviton3() -> None:
    info = summary_from_fixture("arm_graviton3")
    assert info.vendor == "ARM"
    assert info.model == "Neoverse-V1"
    assert info.arch == "aarch64"
    assert (info.sockets, info.physical_cores, info.logical_cores) == (1, 64, 64)
    assert info.numa_nodes == {0: list(range(64))}
    assert info.isa["neon"] and info.isa["sve"] and info.isa["bf16"]
    assert not info.isa["sve2"]
    assert not any(info.isa[f] for f in cpu_text.X86_ISA_FLAGS)


def test_arm_without_lscpu_decodes_part_number() -> None:
    cpuinfo = text("arm_graviton3", "proc/cpuinfo")
    summary = summarize_cpuinfo(parse_proc_cpuinfo(cpuinfo))
    assert summary.logical == 64
    assert summary.model == "Neoverse-V1" and summary.vendor == "ARM"
    assert summary.sockets is None and summary.physical_cores is None  # ARM cpuinfo has no topology
    info = summarize_cpu(cpuinfo_text=cpuinfo)
    assert info.physical_cores == 64 and info.sources["physical_cores"] == "assumed"
    assert info.arch == "aarch64"


def test_fallback_counts_used_when_text_lacks_topology() -> None:
    cpuinfo = "processor\t: 0\nmodel name\t: X\nflags\t: avx2\n\nprocessor\t: 1\nmodel name\t: X\nflags\t: avx2\n"
    info = summarize_cpu(cpuinfo_text=cpuinfo, fallback=CpuFallback(logical=2, physical=1))
    assert (info.logical_cores, info.physical_cores) == (2, 1)
    assert info.sources["physical_cores"] == "psutil"


def test_missing_cpuinfo_uses_py_cpuinfo_style_fallback() -> None:
    fb = CpuFallback(logical=4, physical=2, vendor="GenuineIntel", model="Some Xeon", flags=frozenset({"avx2"}), arch="x86_64")
    info = summarize_cpu(cpuinfo_text=None, fallback=fb)
    assert (info.model, info.vendor, info.logical_cores, info.physical_cores) == ("Some Xeon", "GenuineIntel", 4, 2)
    assert info.isa["avx2"]
    assert info.numa_nodes == {0: [0, 1, 2, 3]}


def test_trailing_non_cpu_blocks_are_ignored() -> None:
    cpuinfo = "processor\t: 0\nFeatures\t: fp asimd\nCPU implementer\t: 0x41\nCPU part\t: 0xd0c\n\nHardware\t: Foo\nSerial\t: 1\n"
    summary = summarize_cpuinfo(parse_proc_cpuinfo(cpuinfo))
    assert summary.logical == 1 and summary.model == "Neoverse-N1"


# ------------------------------------------------------------- usable cores

@pytest.mark.parametrize(
    "affinity, limit, expected",
    [
        (range(64), 4.0, 4),  # cgroup v2 "400000 100000" on a 64-core host
        (range(64), 1.5, 2),  # fractional quota rounds up
        (range(64), None, 64),
        (range(2), 4.0, 2),  # affinity is tighter than the quota
        (range(8), 0.2, 1),
    ],
)
def test_usable_core_count(affinity: range, limit: float | None, expected: int) -> None:
    assert usable_core_count(affinity, limit) == expected


def test_cpu_info_dict_round_trip() -> None:
    info = summary_from_fixture("intel_spr_2s")
    doc = typed.written(info)
    assert list(doc["numa_nodes"]) == ["0", "1"]
    assert typed.read(cpu.CpuInfo, doc) == info
