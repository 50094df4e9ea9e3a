"""Locating this process's cgroup directories (v1 and v2) and parsing the
limit files found there.

Limits apply hierarchically: a parent's quota caps every child, so the
readers walk from the process's own cgroup up to the mount point and the
tightest level wins.
"""
from __future__ import annotations

import math
import os
import posixpath
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from . import _io

# cgroup v1 reports "no memory limit" as PAGE_COUNTER_MAX * page size, which
# varies with the page size (4K: 9223372036854771712, 64K: ...710272).  Any
# value this large is a sentinel, never a real limit.
V1_UNLIMITED_THRESHOLD = 1 << 62


@dataclass(frozen=True)
class CgroupMount:
    mount_point: str
    root: str  # the part of the hierarchy that is mounted there
    version: int  # 1 or 2
    controllers: frozenset[str]


# ---------------------------------------------------------------- parsers

def _unescape_mount_field(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \ooo octal.
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def parse_mountinfo(text: str) -> list[CgroupMount]:
    """cgroup mounts from /proc/self/mountinfo, in file order."""
    mounts: list[CgroupMount] = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        lfields, rfields = left.split(), right.split()
        if len(lfields) < 5 or len(rfields) < 1:
            continue
        fstype = rfields[0]
        if fstype not in ("cgroup", "cgroup2"):
            continue
        superopts = rfields[2].split(",") if len(rfields) > 2 else []
        version = 2 if fstype == "cgroup2" else 1
        controllers = frozenset(superopts) if version == 1 else frozenset()
        mounts.append(
            CgroupMount(
                mount_point=_unescape_mount_field(lfields[4]),
                root=_unescape_mount_field(lfields[3]),
                version=version,
                controllers=controllers,
            )
        )
    return mounts


def parse_proc_cgroup(text: str) -> dict[str, str]:
    """/proc/self/cgroup -> {controller: path}; the v2 entry has key ""."""
    paths: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":
            paths[""] = path
            continue
        for ctrl in controllers.split(","):
            paths[ctrl] = path
    return paths


def cgroup_dirs(
    proc_cgroup: Mapping[str, str], mounts: list[CgroupMount], controller: str
) -> list[str]:
    """Directories holding ``controller``'s files for this process, from its
    own cgroup up to the mount point (leaf first).  [] when not mounted.

    A v1 mount that carries the controller wins over the unified hierarchy:
    on hybrid systems the v2 mount exists but has no controllers attached.
    """
    v1 = [m for m in mounts if m.version == 1 and controller in m.controllers]
    if v1:
        mount, path = v1[0], proc_cgroup.get(controller, "/")
    else:
        v2 = [m for m in mounts if m.version == 2]
        if not v2:
            return []
        mount, path = v2[0], proc_cgroup.get("", "/")
    rel = _relative_to_mount(path, mount.root)
    dirs = []
    while True:
        dirs.append(posixpath.normpath(posixpath.join(mount.mount_point, rel)))
        if rel in ("", "."):
            break
        rel = posixpath.dirname(rel)
    return dirs


def _relative_to_mount(path: str, mount_root: str) -> str:
    path = posixpath.normpath(path or "/")
    mount_root = posixpath.normpath(mount_root or "/")
    if mount_root == "/":
        return path.lstrip("/")
    if path == mount_root:
        return ""
    if path.startswith(mount_root + "/"):
        return path[len(mount_root) + 1:]
    # The process's cgroup is outside the mounted subtree (docker without a
    # cgroup namespace shows host paths): the mount point itself is the best
    # available view of our limits.
    return ""


def parse_cpu_max(text: str) -> float | None:
    """cgroup v2 cpu.max: "max 100000" -> None, "400000 100000" -> 4.0."""
    parts = text.split()
    if not parts or parts[0] == "max":
        return None
    quota = int(parts[0])
    period = int(parts[1]) if len(parts) > 1 else 100000
    if quota <= 0 or period <= 0:
        return None
    return quota / period


def parse_cfs_quota(quota_text: str, period_text: str) -> float | None:
    """cgroup v1 cpu.cfs_quota_us / cpu.cfs_period_us; quota -1 -> None."""
    quota = int(quota_text.strip())
    period = int(period_text.strip())
    if quota <= 0 or period <= 0:
        return None
    return quota / period


def cpu_limit_cores(limit: float | None) -> int | None:
    """Whole cores a CPU quota buys: a 1.5-core quota can keep 2 threads busy
    part-time, which is what a thread count should be sized to."""
    if limit is None:
        return None
    return max(1, math.ceil(limit - 1e-9))


def parse_memory_max(text: str) -> int | None:
    """cgroup v2 memory.max: "max" -> None, else bytes."""
    value = text.strip()
    if not value or value == "max":
        return None
    return int(value)


def parse_memory_limit_in_bytes(text: str) -> int | None:
    """cgroup v1 memory.limit_in_bytes: the huge "unlimited" sentinel -> None."""
    value = text.strip()
    if not value or value == "-1":
        return None
    limit = int(value)
    return None if limit >= V1_UNLIMITED_THRESHOLD else limit


def parse_flat_keyed(text: str) -> dict[str, int]:
    """"key value" lines (memory.stat, cpu.stat) -> {key: int}."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2:
            try:
                out[parts[0]] = int(parts[1])
            except ValueError:
                continue
    return out


# ---------------------------------------------------------------- readers

Reader = Callable[[str], "str | None"]


def standard_mounts(exists: Callable[[str], bool], listdir: Callable[[str], list[str]]) -> list[CgroupMount]:
    """Guess the usual /sys/fs/cgroup layout when mountinfo is unavailable."""
    if exists("/sys/fs/cgroup/cgroup.controllers"):
        return [CgroupMount("/sys/fs/cgroup", "/", 2, frozenset())]
    mounts = []
    for name in listdir("/sys/fs/cgroup"):
        if name == "unified":
            mounts.append(CgroupMount("/sys/fs/cgroup/unified", "/", 2, frozenset()))
        else:
            mounts.append(CgroupMount(f"/sys/fs/cgroup/{name}", "/", 1, frozenset(name.split(","))))
    return mounts


def controller_dirs(
    read: Reader,
    controller: str,
    *,
    exists: Callable[[str], bool],
    listdir: Callable[[str], list[str]],
) -> tuple[int | None, list[str]]:
    """(cgroup version, leaf-first dirs) for a controller of this process."""
    mountinfo = read("/proc/self/mountinfo")
    mounts = parse_mountinfo(mountinfo) if mountinfo else []
    if not mounts:
        mounts = standard_mounts(exists, listdir)
    proc_cgroup = parse_proc_cgroup(read("/proc/self/cgroup") or "")
    dirs = cgroup_dirs(proc_cgroup, mounts, controller)
    if not dirs:
        return None, []
    version = 1 if any(m.version == 1 and controller in m.controllers for m in mounts) else 2
    return version, dirs


def locate(root: str, controller: str) -> tuple[int | None, list[str]]:
    """controller_dirs() for the machine (or fake root) at ``root``."""
    return controller_dirs(
        lambda p: _io.read_text(root, p),
        controller,
        exists=lambda p: os.path.exists(_io.host_path(root, p)),
        listdir=lambda p: _io.list_dir(root, p),
    )
