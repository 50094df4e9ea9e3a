"""CPU identity, topology, ISA and the cores this process may actually use.

Layout follows torch/backends/xeon/run_cpu.py: ``parse_*`` functions are
pure (text in, data out) and are what the tests exercise; ``read_cpu`` is
the thin layer that reads the machine and feeds them.
"""
from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from . import _io, cgroup

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


@dataclass
class CpuInfo:
    vendor: str | None
    model: str | None
    arch: str | None
    sockets: int
    physical_cores: int
    logical_cores: int
    threads_per_core: int
    usable_cores: int
    usable_cpus: list[int]
    cgroup_cpu_limit: float | None
    numa_nodes: dict[int, list[int]]
    usable_numa_nodes: dict[int, list[int]]
    caches: dict[str, dict[str, int | None]]
    isa: dict[str, bool]
    sources: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        doc = asdict(self)
        # JSON object keys must be strings; keep node order numeric.
        doc["numa_nodes"] = {str(k): v for k, v in sorted(self.numa_nodes.items())}
        doc["usable_numa_nodes"] = {str(k): v for k, v in sorted(self.usable_numa_nodes.items())}
        return doc

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> CpuInfo:
        data = dict(doc)
        for key in ("numa_nodes", "usable_numa_nodes"):
            data[key] = {int(k): list(v) for k, v in (data.get(key) or {}).items()}
        # A partial document (a hand-written or older record) reads as a one-core machine
        # that says nothing more about itself.
        usable = int(data.get("usable_cores") or len(data.get("usable_cpus") or []) or 1)
        defaults: dict[str, Any] = {
            "vendor": None, "model": None, "arch": None, "sockets": 1, "physical_cores": usable,
            "logical_cores": usable, "threads_per_core": 1, "usable_cores": usable,
            "usable_cpus": [], "cgroup_cpu_limit": None, "caches": {}, "isa": {},
        }
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{**{k: v for k, v in defaults.items() if k in known},
                      **{k: v for k, v in data.items() if k in known and v is not None}})


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


# ---------------------------------------------------------------- parsers

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


def _first(lscpu: Mapping[str, list[str]], key: str) -> str | None:
    values = lscpu.get(key)
    return values[0] if values else None


def _first_int(lscpu: Mapping[str, list[str]], key: str) -> int | None:
    value = _first(lscpu, key)
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


def usable_core_count(affinity: Iterable[int], cgroup_limit: float | None) -> int:
    """min(|affinity mask|, ceil(cgroup quota)): threads beyond either bound
    only contend (affinity) or get throttled (quota)."""
    count = len(set(affinity))
    quota_cores = cgroup.cpu_limit_cores(cgroup_limit)
    if quota_cores is not None:
        count = min(count, quota_cores)
    return max(1, count)


@dataclass(frozen=True)
class CpuFallback:
    """Facts from live-only sources (psutil, py-cpuinfo, platform) used only
    when the text sources lack them; left empty for fake roots."""

    logical: int | None = None
    physical: int | None = None
    vendor: str | None = None
    model: str | None = None
    flags: frozenset[str] = frozenset()
    arch: str | None = None


def summarize_cpu(
    *,
    cpuinfo_text: str | None,
    lscpu_text: str | None = None,
    node_cpulists: Mapping[int, str] | None = None,
    affinity: Iterable[int] | None = None,
    cgroup_limit: float | None = None,
    sysfs_caches: Iterable[Mapping[str, str]] = (),
    fallback: CpuFallback = CpuFallback(),
) -> CpuInfo:
    """Combine every text source into one CpuInfo.  Pure.

    Precedence per field: /proc/cpuinfo (per-CPU truth), then lscpu, then
    live fallbacks.  lscpu's model name wins over cpuinfo's on ARM where it
    decodes the part number for us.
    """
    sources: dict[str, str] = {}
    info = summarize_cpuinfo(parse_proc_cpuinfo(cpuinfo_text)) if cpuinfo_text else summarize_cpuinfo([])
    lscpu = parse_lscpu(lscpu_text) if lscpu_text else {}

    logical = info.logical or _first_int(lscpu, "cpu(s)") or fallback.logical or os.cpu_count() or 1
    sources["logical_cores"] = "cpuinfo" if info.logical else ("lscpu" if _first_int(lscpu, "cpu(s)") else "fallback")

    physical = info.physical_cores
    sources["physical_cores"] = "cpuinfo"
    if physical is None:
        physical, sources["physical_cores"] = lscpu_physical_cores(lscpu), "lscpu"
    if physical is None and fallback.physical:
        physical, sources["physical_cores"] = fallback.physical, "psutil"
    if physical is None:
        # No topology anywhere: assume no SMT rather than invent one.
        physical, sources["physical_cores"] = logical, "assumed"

    sockets = info.sockets or _first_int(lscpu, "socket(s)") or 1

    vendor = info.vendor or _first(lscpu, "vendor id") or fallback.vendor
    model = _first(lscpu, "model name") if info.arm_ids else None
    model = model or info.model or _first(lscpu, "model name") or fallback.model
    arch = _first(lscpu, "architecture") or _guess_arch(info) or fallback.arch

    flags = info.flags or frozenset((_first(lscpu, "flags") or "").split()) or fallback.flags

    nodes = {n: parse_cpulist(t) for n, t in (node_cpulists or {}).items()}
    if not nodes:
        nodes = lscpu_numa_nodes(lscpu)
    if not nodes:
        nodes = {0: list(range(logical))}

    online = _first(lscpu, "on-line cpu(s) list")
    usable = sorted(set(affinity)) if affinity is not None else (
        parse_cpulist(online) if online else list(range(logical))
    )
    usable_set = set(usable)
    usable_nodes = {n: [c for c in cpus if c in usable_set] for n, cpus in nodes.items()}
    usable_nodes = {n: cpus for n, cpus in usable_nodes.items() if cpus}

    caches = lscpu_caches(lscpu) or parse_sysfs_caches(sysfs_caches)

    return CpuInfo(
        vendor=vendor,
        model=model,
        arch=arch,
        sockets=sockets,
        physical_cores=physical,
        logical_cores=logical,
        threads_per_core=max(1, logical // physical) if physical else 1,
        usable_cores=usable_core_count(usable, cgroup_limit),
        usable_cpus=usable,
        cgroup_cpu_limit=cgroup_limit,
        numa_nodes=dict(sorted(nodes.items())),
        usable_numa_nodes=dict(sorted(usable_nodes.items())),
        caches=caches,
        isa=isa_from_flags(flags),
        sources=sources,
    )


def _guess_arch(info: CpuinfoSummary) -> str | None:
    if info.arm_ids is not None:
        return "aarch64"
    if "lm" in info.flags:
        return "x86_64"
    return None


# ---------------------------------------------------------------- readers

def read_cgroup_cpu_limit(root: str = "/") -> float | None:
    """Tightest CPU quota (in cores) over this process's cgroup ancestry."""
    read = lambda p: _io.read_text(root, p)  # noqa: E731
    version, dirs = cgroup.locate(root, "cpu")
    limits: list[float] = []
    for d in dirs:
        try:
            if version == 2:
                text = read(f"{d}/cpu.max")
                limit = cgroup.parse_cpu_max(text) if text else None
            else:
                quota, period = read(f"{d}/cpu.cfs_quota_us"), read(f"{d}/cpu.cfs_period_us")
                limit = cgroup.parse_cfs_quota(quota, period) if quota and period else None
        except ValueError:
            limit = None
        if limit is not None:
            limits.append(limit)
    return min(limits) if limits else None


def read_affinity(root: str = "/") -> list[int] | None:
    if _io.is_live(root) and hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    status = _io.read_text(root, "/proc/self/status")
    return parse_status_cpus_allowed(status) if status else None


def read_node_cpulists(root: str = "/") -> dict[int, str]:
    out: dict[int, str] = {}
    for name in _io.list_dir(root, "/sys/devices/system/node"):
        match = re.fullmatch(r"node(\d+)", name)
        if match:
            text = _io.read_text(root, f"/sys/devices/system/node/{name}/cpulist")
            if text is not None:
                out[int(match.group(1))] = text
    return out


def read_sysfs_caches(root: str = "/") -> list[dict[str, str]]:
    base = "/sys/devices/system/cpu/cpu0/cache"
    entries = []
    for name in _io.list_dir(root, base):
        if name.startswith("index"):
            entry = {}
            for key in ("level", "type", "size"):
                text = _io.read_text(root, f"{base}/{name}/{key}")
                if text is not None:
                    entry[key] = text.strip()
            entries.append(entry)
    return entries


def live_fallback(*, need_cpuinfo: bool) -> CpuFallback:
    """psutil counts, plus py-cpuinfo only when /proc/cpuinfo is missing:
    py-cpuinfo is slow (it may spawn subprocesses), so it is a last resort."""
    import platform

    logical = physical = None
    try:
        import psutil

        logical = psutil.cpu_count(logical=True)
        physical = psutil.cpu_count(logical=False)
    except Exception:  # psutil missing or unsupported platform
        pass
    vendor = model = None
    flags: frozenset[str] = frozenset()
    if need_cpuinfo:
        try:
            import cpuinfo  # py-cpuinfo

            data = cpuinfo.get_cpu_info()
            vendor = data.get("vendor_id_raw")
            model = data.get("brand_raw")
            flags = frozenset(data.get("flags", []))
        except Exception:
            pass
    return CpuFallback(
        logical=logical, physical=physical, vendor=vendor, model=model, flags=flags,
        arch=platform.machine() or None,
    )


def read_cpu(
    root: str = "/",
    *,
    lscpu_text: str | None = None,
    run: _io.Runner = subprocess.run,
) -> CpuInfo:
    """Read this machine (or a fake ``root``) and summarise it."""
    cpuinfo_text = _io.read_text(root, "/proc/cpuinfo")
    if lscpu_text is None:
        lscpu_text = _io.command_output(root, "lscpu", ["lscpu"], run=run, env=_c_locale_env())
    live = _io.is_live(root)
    fallback = live_fallback(need_cpuinfo=not cpuinfo_text) if live else CpuFallback()
    return summarize_cpu(
        cpuinfo_text=cpuinfo_text,
        lscpu_text=lscpu_text,
        node_cpulists=read_node_cpulists(root),
        affinity=read_affinity(root),
        cgroup_limit=read_cgroup_cpu_limit(root),
        sysfs_caches=read_sysfs_caches(root) if not lscpu_text else (),
        fallback=fallback,
    )


def _c_locale_env() -> dict[str, str]:
    # lscpu translates its labels; the parser only knows the C locale ones.
    return {**os.environ, "LC_ALL": "C"}
