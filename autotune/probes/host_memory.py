"""Host memory and the cgroup memory budget of this process."""
from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from . import _io, cgroup


@dataclass
class MemoryInfo:
    total_bytes: int | None = None
    available_bytes: int | None = None
    cgroup_limit_bytes: int | None = None
    cgroup_usage_bytes: int | None = None
    usable_bytes: int | None = None
    # Size of /dev/shm: DataLoader workers pass batches through it, NCCL's SHM transport too.
    shm_bytes: int | None = None


@dataclass(frozen=True)
class CgroupMemoryLevel:
    """One level of the cgroup ancestry."""

    limit: int | None
    usage: int | None
    inactive_file: int = 0


# ---------------------------------------------------------------- parsers

def parse_meminfo(text: str) -> dict[str, int]:
    """/proc/meminfo -> {field: bytes} (the file says kB, meaning KiB)."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, sep, rest = line.partition(":")
        parts = rest.split()
        if not sep or not parts:
            continue
        try:
            value = int(parts[0])
        except ValueError:
            continue
        out[key.strip()] = value * 1024 if len(parts) > 1 and parts[1].lower() == "kb" else value
    return out


def cgroup_level(
    *, version: int, limit_text: str | None, usage_text: str | None, stat_text: str | None
) -> CgroupMemoryLevel:
    """Parse one cgroup directory's memory files (v2 memory.max/current/stat,
    v1 memory.limit_in_bytes/usage_in_bytes/stat)."""
    parse_limit = cgroup.parse_memory_max if version == 2 else cgroup.parse_memory_limit_in_bytes
    limit = parse_limit(limit_text) if limit_text else None
    usage = int(usage_text.strip()) if usage_text and usage_text.strip().isdigit() else None
    stat = cgroup.parse_flat_keyed(stat_text) if stat_text else {}
    # v1 has both a local and a hierarchical ("total_") figure; the latter
    # matches usage_in_bytes, which is hierarchical too.
    if version == 2:
        inactive = stat.get("inactive_file", 0)
    else:
        inactive = stat.get("total_inactive_file", stat.get("inactive_file", 0))
    return CgroupMemoryLevel(limit=limit, usage=usage, inactive_file=inactive)


def summarize_memory(
    *, total: int | None, available: int | None, levels: Iterable[CgroupMemoryLevel] = ()
) -> MemoryInfo:
    """Pure: usable = min(host available, tightest cgroup headroom).

    Headroom subtracts the working set, not raw usage: usage counts page
    cache, and inactive file pages are reclaimed before the OOM killer
    fires (the same working-set rule the kubelet uses).
    """
    limit: int | None = None
    usage: int | None = None
    headroom: int | None = None
    for level in levels:
        if level.limit is None:
            continue
        if limit is None or level.limit < limit:
            limit, usage = level.limit, level.usage
        if level.usage is not None:
            working_set = max(0, level.usage - level.inactive_file)
            room = max(0, level.limit - working_set)
            headroom = room if headroom is None else min(headroom, room)
        elif headroom is None or level.limit < headroom:
            headroom = level.limit
    candidates = [v for v in (available, headroom) if v is not None]
    return MemoryInfo(
        total_bytes=total,
        available_bytes=available,
        cgroup_limit_bytes=limit,
        cgroup_usage_bytes=usage,
        usable_bytes=min(candidates) if candidates else None,
    )


def statvfs_size(stat: Any) -> int | None:
    """A file system's size from os.statvfs: fragment size x blocks."""
    try:
        return int(stat.f_frsize) * int(stat.f_blocks)
    except (AttributeError, TypeError, ValueError):
        return None


# ---------------------------------------------------------------- readers

def read_shm_bytes(root: str = "/", *, statvfs: Any = os.statvfs) -> int | None:
    """The size of ``root``'s /dev/shm, None where there is none."""
    path = os.path.join(root, "dev", "shm")
    try:
        return statvfs_size(statvfs(path)) if os.path.isdir(path) else None
    except OSError:
        return None


def read_cgroup_memory_levels(root: str = "/") -> list[CgroupMemoryLevel]:
    read = lambda p: _io.read_text(root, p)  # noqa: E731
    version, dirs = cgroup.locate(root, "memory")
    levels = []
    for d in dirs:
        if version == 2:
            names = ("memory.max", "memory.current", "memory.stat")
        else:
            names = ("memory.limit_in_bytes", "memory.usage_in_bytes", "memory.stat")
        texts = [read(f"{d}/{n}") for n in names]
        try:
            levels.append(cgroup_level(version=version or 2, limit_text=texts[0],
                                       usage_text=texts[1], stat_text=texts[2]))
        except ValueError:
            continue
    return levels


def read_host_memory(root: str = "/") -> tuple[int | None, int | None]:
    """(total, available): psutil on the live machine, /proc/meminfo otherwise."""
    if _io.is_live(root):
        try:
            import psutil

            vm = psutil.virtual_memory()
            return int(vm.total), int(vm.available)
        except Exception:
            pass
    text = _io.read_text(root, "/proc/meminfo")
    info = parse_meminfo(text) if text else {}
    return info.get("MemTotal"), info.get("MemAvailable", info.get("MemFree"))


def read_memory(root: str = "/") -> MemoryInfo:
    total, available = read_host_memory(root)
    info = summarize_memory(total=total, available=available, levels=read_cgroup_memory_levels(root))
    info.shm_bytes = read_shm_bytes(root)
    return info
