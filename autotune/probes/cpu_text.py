"""The CPU's text, parsed: /proc/cpuinfo, lscpu, sysfs and /proc/<pid>/status in, data
out. Pure functions, as torch/backends/xeon/run_cpu.py keeps them: ``probes.cpu`` reads
the machine and feeds them.
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

# Flags reported as booleans in every document, whatever the architecture,
# so consumers can index them without a key check.
X86_ISA_FLAGS: tuple[str, ...] = (
    "avx2",
    "fma",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "avx_vnni",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
)
# ARM key -> the /proc/cpuinfo "Features" spellings that imply it.
ARM_ISA_FLAGS: dict[str, tuple[str, ...]] = {
    "neon": ("asimd", "neon"),
    "sve": ("sve",),
    "sve2": ("sve2",),
    "bf16": ("bf16",),
    "i8mm": ("i8mm",),
}
ISA_KEYS: tuple[str, ...] = X86_ISA_FLAGS + tuple(ARM_ISA_FLAGS)

# Kernels do not put a model name in /proc/cpuinfo on ARM, so decode the
# MIDR implementer/part fields for the server cores people train on.
ARM_IMPLEMENTERS: dict[int, str] = {
    0x41: "ARM",
    0x42: "Broadcom",
    0x43: "Cavium",
    0x46: "Fujitsu",
    0x48: "HiSilicon",
    0x4E: "NVIDIA",
    0x50: "APM",
    0x51: "Qualcomm",
    0x61: "Apple",
    0xC0: "Ampere",
}
ARM_PARTS: dict[tuple[int, int], str] = {
    (0x41, 0xD03): "Cortex-A53",
    (0x41, 0xD05): "Cortex-A55",
    (0x41, 0xD07): "Cortex-A57",
    (0x41, 0xD08): "Cortex-A72",
    (0x41, 0xD0B): "Cortex-A76",
    (0x41, 0xD0C): "Neoverse-N1",
    (0x41, 0xD40): "Neoverse-V1",
    (0x41, 0xD49): "Neoverse-N2",
    (0x41, 0xD4F): "Neoverse-V2",
    (0x41, 0xD84): "Neoverse-V3",
    (0x41, 0xD8E): "Neoverse-N3",
    (0x46, 0x001): "A64FX",
    (0x48, 0xD01): "Kunpeng-920",
    (0xC0, 0xAC3): "AmpereOne",
}

CACHE_LEVELS = ("l1d", "l1i", "l2", "l3")


@dataclass(frozen=True)
class CpuinfoSummary:
    """What /proc/cpuinfo alone says."""

    logical: int
    vendor: str | None
    model: str | None
    flags: frozenset[str]
    sockets: int | None
    physical_cores: int | None
    arm_ids: tuple[int, int] | None  # (implementer, part)


def parse_cpulist(text: str) -> list[int]:
    """Kernel cpu list syntax ("0-3,8,10-11") -> sorted cpu ids."""
    cpus: set[int] = set()
    for chunk in text.strip().split(","):
        chunk = chunk.strip()
        if not chunk:
            continue
        if "-" in chunk:
            lo, hi = chunk.split("-", 1)
            cpus.update(range(int(lo), int(hi) + 1))
        else:
            cpus.add(int(chunk))
    return sorted(cpus)


def format_cpulist(cpus: Iterable[int]) -> str:
    """Inverse of parse_cpulist, for reports and numactl/taskset arguments."""
    ids = sorted(set(cpus))
    ranges: list[str] = []
    start = prev = None
    for cpu in ids:
        if start is None:
            start = prev = cpu
        elif prev is not None and cpu == prev + 1:
            prev = cpu
        else:
            ranges.append(f"{start}-{prev}" if start != prev else f"{start}")
            start = prev = cpu
    if start is not None:
        ranges.append(f"{start}-{prev}" if start != prev else f"{start}")
    return ",".join(ranges)


def parse_proc_cpuinfo(text: str) -> list[dict[str, str]]:
    """/proc/cpuinfo -> one dict per logical processor block."""
    blocks: list[dict[str, str]] = []
    current: dict[str, str] = {}
    for line in text.splitlines() + [""]:
        if not line.strip():
            if current:
                blocks.append(current)
                current = {}
            continue
        key, sep, value = line.partition(":")
        if sep:
            current[key.strip()] = value.strip()
    # Trailing per-system blocks (ARM "Hardware", "Serial") are not CPUs.
    return [b for b in blocks if b.get("processor", "").isdigit()]


def summarize_cpuinfo(blocks: list[dict[str, str]]) -> CpuinfoSummary:
    if not blocks:
        return CpuinfoSummary(0, None, None, frozenset(), None, None, None)
    first = blocks[0]
    flags = frozenset((first.get("flags") or first.get("Features") or "").split())
    arm_ids = _arm_ids(first)
    vendor = first.get("vendor_id")
    model = first.get("model name")
    if arm_ids is not None:
        vendor = vendor or ARM_IMPLEMENTERS.get(arm_ids[0], f"0x{arm_ids[0]:02x}")
        model = model or ARM_PARTS.get(arm_ids)
    packages = {b["physical id"] for b in blocks if "physical id" in b}
    cores = {(b["physical id"], b["core id"]) for b in blocks if "physical id" in b and "core id" in b}
    return CpuinfoSummary(
        logical=len(blocks),
        vendor=vendor,
        model=model,
        flags=flags,
        sockets=len(packages) or None,
        physical_cores=len(cores) or None,
        arm_ids=arm_ids,
    )


def _arm_ids(block: Mapping[str, str]) -> tuple[int, int] | None:
    try:
        return int(block["CPU implementer"], 16), int(block["CPU part"], 16)
    except (KeyError, ValueError):
        return None


def parse_lscpu(text: str) -> dict[str, list[str]]:
    """``lscpu`` output -> {normalised key: [values in order]}.

    Keys are lower-cased and stripped of indentation and a trailing
    " cache", so the flat ("L1d cache:") and tree ("  L1d:") layouts of
    different util-linux versions read the same.  Values are lists because
    heterogeneous CPUs repeat "Model name"/"Core(s) per socket" per core type.
    """
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key = key.strip().lower()
        if key.endswith(" cache"):
            key = key[: -len(" cache")]
        value = value.strip()
        if value:
            out.setdefault(key, []).append(value)
    return out


def lscpu_value(lscpu: Mapping[str, list[str]], key: str) -> str | None:
    values = lscpu.get(key)
    return values[0] if values else None


def lscpu_int(lscpu: Mapping[str, list[str]], key: str) -> int | None:
    value = lscpu_value(lscpu, key)
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def lscpu_physical_cores(lscpu: Mapping[str, list[str]]) -> int | None:
    cores = lscpu.get("core(s) per socket") or lscpu.get("core(s) per cluster") or []
    sockets = lscpu.get("socket(s)") or lscpu.get("cluster(s)") or []
    try:
        if cores and len(cores) == len(sockets):
            return sum(int(c) * int(s) for c, s in zip(cores, sockets))
        if cores and not sockets:
            return sum(int(c) for c in cores)
    except ValueError:
        return None
    return None


def lscpu_numa_nodes(lscpu: Mapping[str, list[str]]) -> dict[int, list[int]]:
    nodes: dict[int, list[int]] = {}
    for key, values in lscpu.items():
        match = re.fullmatch(r"numa node(\d+) cpu\(s\)", key)
        if match:
            nodes[int(match.group(1))] = parse_cpulist(values[0])
    return nodes


_SIZE_UNITS = {
    "": 1, "b": 1,
    "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10,
    "m": 1 << 20, "mb": 1 << 20, "mib": 1 << 20,
    "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30,
}


def parse_size(text: str) -> int | None:
    """"64 KiB", "32K", "1.5 MiB" -> bytes (binary units, as lscpu and sysfs mean)."""
    match = re.fullmatch(r"\s*([\d.]+)\s*([a-zA-Z]*)\s*", text)
    if not match:
        return None
    unit = _SIZE_UNITS.get(match.group(2).lower())
    if unit is None:
        return None
    return int(float(match.group(1)) * unit)


def parse_lscpu_cache(value: str) -> dict[str, int | None]:
    """One lscpu cache value.  New util-linux prints the machine total with
    an instance count ("1 MiB (2 instances)"); old versions print the size
    of one instance ("512K")."""
    match = re.fullmatch(r"\s*(.+?)\s*\((\d+)\s+instances?\)\s*", value)
    if match:
        total = parse_size(match.group(1))
        instances = int(match.group(2))
        per = total // instances if total is not None and instances else None
        return {"size_bytes": per, "instances": instances, "total_bytes": total}
    return {"size_bytes": parse_size(value), "instances": None, "total_bytes": None}


def lscpu_caches(lscpu: Mapping[str, list[str]]) -> dict[str, dict[str, int | None]]:
    return {level: parse_lscpu_cache(lscpu[level][0]) for level in CACHE_LEVELS if lscpu.get(level)}


def parse_sysfs_caches(entries: Iterable[Mapping[str, str]]) -> dict[str, dict[str, int | None]]:
    """cpu0's /sys/devices/system/cpu/cpu0/cache/index*/{level,type,size}
    -> per-instance sizes (the fallback when lscpu is missing)."""
    out: dict[str, dict[str, int | None]] = {}
    for entry in entries:
        level = entry.get("level", "").strip()
        ctype = entry.get("type", "").strip().lower()
        size = parse_size(entry.get("size", ""))
        if not level or size is None:
            continue
        suffix = {"data": "d", "instruction": "i"}.get(ctype, "")
        key = f"l{level}{suffix}" if level == "1" else f"l{level}"
        out[key] = {"size_bytes": size, "instances": None, "total_bytes": None}
    return out


def isa_from_flags(flags: Iterable[str]) -> dict[str, bool]:
    """Raw cpu flags (x86 "flags" or ARM "Features") -> the ISA booleans."""
    have = {f.lower() for f in flags}
    isa = {name: name in have for name in X86_ISA_FLAGS}
    for name, spellings in ARM_ISA_FLAGS.items():
        isa[name] = any(s in have for s in spellings)
    return isa


def parse_status_cpus_allowed(text: str) -> list[int] | None:
    """Cpus_allowed_list from /proc/<pid>/status (the affinity mask)."""
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == "Cpus_allowed_list":
            return parse_cpulist(value)
    return None
