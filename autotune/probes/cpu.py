"""CPU identity, topology, ISA and the cores this process may actually use.

Layout follows torch/backends/xeon/run_cpu.py: the ``parse_*`` functions of
``probes.cpu_text`` are pure (text in, data out) and are what the tests exercise;
``summarize_cpu`` combines their results, and ``read_cpu`` is the thin layer that
reads the machine and feeds them.
"""
from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from . import _io, cgroup
from .cpu_text import (
    CpuinfoSummary,
    isa_from_flags,
    lscpu_caches,
    lscpu_int,
    lscpu_numa_nodes,
    lscpu_physical_cores,
    lscpu_value,
    parse_cpulist,
    parse_lscpu,
    parse_proc_cpuinfo,
    parse_status_cpus_allowed,
    parse_sysfs_caches,
    summarize_cpuinfo,
)


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


def given_cpu(doc: Mapping[str, Any]) -> dict[str, Any]:
    """A document's cpu section with what it lacks filled in: a partial document (a
    hand-written or older record) reads as a one-core machine that says nothing more about
    itself."""
    cores = doc.get("usable_cores")  # anything but a count is refused by the reader, by name
    usable = cores if isinstance(cores, int) and cores > 0 else len(doc.get("usable_cpus") or []) or 1
    defaults: dict[str, Any] = {
        "vendor": None, "model": None, "arch": None, "sockets": 1, "physical_cores": usable,
        "logical_cores": usable, "threads_per_core": 1, "usable_cores": usable, "usable_cpus": [],
        "cgroup_cpu_limit": None, "numa_nodes": {}, "usable_numa_nodes": {}, "caches": {}, "isa": {},
        "sources": {}}
    return {**defaults, **{k: v for k, v in doc.items() if v is not None}}


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

    logical = info.logical or lscpu_int(lscpu, "cpu(s)") or fallback.logical or os.cpu_count() or 1
    sources["logical_cores"] = "cpuinfo" if info.logical else ("lscpu" if lscpu_int(lscpu, "cpu(s)") else "fallback")

    physical = info.physical_cores
    sources["physical_cores"] = "cpuinfo"
    if physical is None:
        physical, sources["physical_cores"] = lscpu_physical_cores(lscpu), "lscpu"
    if physical is None and fallback.physical:
        physical, sources["physical_cores"] = fallback.physical, "psutil"
    if physical is None:
        # No topology anywhere: assume no SMT rather than invent one.
        physical, sources["physical_cores"] = logical, "assumed"

    sockets = info.sockets or lscpu_int(lscpu, "socket(s)") or 1

    vendor = info.vendor or lscpu_value(lscpu, "vendor id") or fallback.vendor
    model = lscpu_value(lscpu, "model name") if info.arm_ids else None
    model = model or info.model or lscpu_value(lscpu, "model name") or fallback.model
    arch = lscpu_value(lscpu, "architecture") or _guess_arch(info) or fallback.arch

    flags = info.flags or frozenset((lscpu_value(lscpu, "flags") or "").split()) or fallback.flags

    nodes = {n: parse_cpulist(t) for n, t in (node_cpulists or {}).items()}
    if not nodes:
        nodes = lscpu_numa_nodes(lscpu)
    if not nodes:
        nodes = {0: list(range(logical))}

    online = lscpu_value(lscpu, "on-line cpu(s) list")
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
