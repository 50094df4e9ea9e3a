"""Native libraries a trial may preload (jemalloc, tcmalloc, Intel's OpenMP) and the
pinning tools (numactl, taskset): where ld.so would find each, or None."""
from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from . import _io

# Versioned names count: distro packages often ship only the runtime
# soname (libjemalloc.so.2) without the -dev symlink.
ALLOCATOR_NAMES: dict[str, tuple[str, ...]] = {
    "jemalloc": ("libjemalloc.so", "libjemalloc.so.2"),
    "tcmalloc": ("libtcmalloc.so", "libtcmalloc.so.4", "libtcmalloc_minimal.so", "libtcmalloc_minimal.so.4"),
}
IOMP_NAMES = ("libiomp5.so",)


@dataclass(frozen=True)
class LdconfigEntry:
    name: str
    tags: tuple[str, ...]
    path: str


def parse_ldconfig_p(text: str) -> list[LdconfigEntry]:
    """``ldconfig -p`` -> entries.  Line shape:
    "\tlibjemalloc.so.2 (libc6,x86-64) => /lib/x86_64-linux-gnu/libjemalloc.so.2"."""
    entries: list[LdconfigEntry] = []
    for line in text.splitlines():
        left, sep, path = line.partition("=>")
        if not sep:
            continue
        left = left.strip()
        name, _, tags = left.partition(" (")
        tag_list = tuple(t.strip() for t in tags.rstrip(")").split(",") if t.strip())
        entries.append(LdconfigEntry(name=name.strip(), tags=tag_list, path=path.strip()))
    return entries


def ldconfig_arch_tag(machine: str) -> str | None:
    """The ldconfig tag of native libraries, to skip 32-bit/foreign ones."""
    return {
        "x86_64": "x86-64", "amd64": "x86-64",
        "aarch64": "AArch64", "arm64": "AArch64",
        "ppc64le": "64bit", "s390x": "64bit", "riscv64": "64bit",
    }.get(machine.lower())


def library_search_dirs(*, env: Mapping[str, str], prefix: str, machine: str) -> tuple[list[str], list[str]]:
    """(dirs searched before the ld.so cache, dirs searched after it).

    Before: what the user pointed LD_LIBRARY_PATH at (ld.so honours it
    first too) and the environment's own lib, where conda/pip installs of
    jemalloc or intel-openmp land and which matches the torch in use.
    After: the distro's multiarch and classic locations, for libraries
    installed without running ldconfig.
    """
    before = [d for d in env.get("LD_LIBRARY_PATH", "").split(":") if d]
    before.append(os.path.join(prefix, "lib"))
    after: list[str] = []
    triplet = {"x86_64": "x86_64-linux-gnu", "aarch64": "aarch64-linux-gnu"}.get(machine.lower())
    if triplet:
        after += [f"/usr/lib/{triplet}", f"/lib/{triplet}", f"/usr/local/lib/{triplet}"]
    after += ["/usr/lib64", "/lib64", "/usr/local/lib64", "/usr/local/lib", "/usr/lib", "/lib"]
    return _dedupe(before), [d for d in _dedupe(after) if d not in before]


def _dedupe(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(items))


def find_library(
    names: Sequence[str],
    *,
    before: Iterable[str] = (),
    ldconfig: Iterable[LdconfigEntry] = (),
    after: Iterable[str] = (),
    arch_tag: str | None = None,
    exists: Callable[[str], bool] = os.path.isfile,
) -> str | None:
    """First existing file among ``names`` in ``before`` dirs, then the ld.so
    cache (native-arch entries only), then ``after`` dirs.  The result is a
    path suitable for LD_PRELOAD."""
    for d in before:
        for name in names:
            if exists(path := os.path.join(d, name)):
                return path
    for entry in ldconfig:
        if entry.name in names and (arch_tag is None or arch_tag in entry.tags) and exists(entry.path):
            return entry.path
    for d in after:
        for name in names:
            if exists(path := os.path.join(d, name)):
                return path
    return None


def read_ldconfig(*, run: _io.Runner = subprocess.run) -> list[LdconfigEntry]:
    """The ld.so cache's entries (``ldconfig -p``), or none if ldconfig is missing or fails."""
    for exe in ("ldconfig", "/sbin/ldconfig", "/usr/sbin/ldconfig"):
        path = shutil.which(exe) or (exe if os.path.isabs(exe) and os.path.exists(exe) else None)
        if path:
            rc, out, _ = _io.run_text([path, "-p"], run=run, timeout=10)
            if rc == 0:
                return parse_ldconfig_p(out)
    return []


def find_native_libraries(
    *,
    env: Mapping[str, str] | None = None,
    ldconfig: Iterable[LdconfigEntry] = (),
    prefix: str = sys.prefix,
    machine: str | None = None,
    exists: Callable[[str], bool] = os.path.isfile,
) -> tuple[dict[str, str | None], dict[str, str | None]]:
    """({"jemalloc": path, "tcmalloc": path}, {"iomp5": path})."""
    env = os.environ if env is None else env
    machine = machine or platform.machine()
    before, after = library_search_dirs(env=env, prefix=prefix, machine=machine)
    ldconfig = list(ldconfig)
    tag = ldconfig_arch_tag(machine)
    find = lambda names: find_library(  # noqa: E731
        names, before=before, ldconfig=ldconfig, after=after, arch_tag=tag, exists=exists
    )
    allocators = {name: find(names) for name, names in ALLOCATOR_NAMES.items()}
    return allocators, {"iomp5": find(IOMP_NAMES)}


def find_tools(which: Callable[[str], str | None] = shutil.which) -> dict[str, str | None]:
    """Paths of the pinning tools (numactl, taskset), None for each one not installed."""
    return {tool: which(tool) for tool in ("numactl", "taskset")}
