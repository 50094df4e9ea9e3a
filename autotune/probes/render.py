"""Plain-text report of a probe document (``autotune probe``)."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .cpu_text import format_cpulist
from .fingerprint import fingerprint_id
from .units import format_bytes

LABEL_WIDTH = 11


def _yes_no(value: Any) -> str:
    return "yes" if value else "no"


def _path(value: str | None) -> str:
    return value or "-"


def _section(label: str, lines: list[str]) -> list[str]:
    lines = lines or ["-"]
    pad = " " * LABEL_WIDTH
    return [f"{label:<{LABEL_WIDTH}}{lines[0]}"] + [pad + line for line in lines[1:]]


def _cpu_lines(cpu: Mapping[str, Any]) -> list[str]:
    sockets = cpu.get("sockets")
    lines = [
        f"{cpu.get('model') or 'unknown model'} ({cpu.get('vendor') or '?'}, {cpu.get('arch') or '?'})",
        f"{sockets} socket{'s' if sockets != 1 else ''}, {cpu.get('physical_cores')} physical cores, "
        f"{cpu.get('logical_cores')} logical ({cpu.get('threads_per_core')} thread(s)/core)",
    ]
    limit = cpu.get("cgroup_cpu_limit")
    quota = f"cgroup quota {limit:g} cores" if limit is not None else "no cgroup quota"
    lines.append(
        f"usable: {cpu.get('usable_cores')} cores (affinity {format_cpulist(cpu.get('usable_cpus') or [])}; {quota})"
    )
    nodes = cpu.get("numa_nodes") or {}
    lines.append("NUMA: " + ("; ".join(f"node{n} {format_cpulist(c) or '(no cpus)'}" for n, c in nodes.items()) or "-"))
    caches = cpu.get("caches") or {}
    if caches:
        parts = []
        for level, c in caches.items():
            count = f" x{c['instances']}" if c.get("instances") else ""
            parts.append(f"{level.upper()} {format_bytes(c.get('size_bytes'))}{count}")
        lines.append("caches: " + ", ".join(parts))
    isa = [flag for flag, present in (cpu.get("isa") or {}).items() if present]
    lines.append("ISA: " + (" ".join(isa) or "none of the tracked extensions"))
    return lines


def _gpu_lines(doc: Mapping[str, Any]) -> list[str]:
    gpus = doc.get("gpus") or []
    if not gpus:
        return [f"none ({doc.get('gpu_error')})" if doc.get("gpu_error") else "none"]
    lines = []
    for g in gpus:
        line = (f"{g['index']}: {g.get('name')}, {format_bytes(g.get('memory_bytes'))}, "
                f"sm {g.get('compute_capability') or '?'}")
        if g.get("compute_mode"):
            line += f", compute mode {g['compute_mode']}"
        if g.get("mig"):
            line += f", MIG on ({len(g.get('mig_devices') or [])} instance(s))"
        if g.get("processes"):
            line += f", {g['processes']} other process(es)"
        lines.append(line)
        lines += [f"   MIG {m.get('index')}: {m.get('name')}, {format_bytes(m.get('memory_bytes'))}, {m.get('uuid')}"
                  for m in g.get("mig_devices") or []]
    for link in doc.get("gpu_links") or []:
        kind = "NVLink" if link.get("nvlink") else f"p2p {link.get('p2p') or '?'}"
        lines.append(f"{link['a']}<->{link['b']}: {kind}, topology {link.get('topology') or '?'}")
    driver = doc.get("driver") or {}
    if driver.get("version"):
        lines.append(f"driver {driver['version']} (CUDA {driver.get('cuda_driver_version') or '?'})")
    return lines


def _torch_lines(doc: Mapping[str, Any]) -> list[str]:
    torch = doc.get("torch") or {}
    if not torch.get("version"):
        return [f"not available ({torch.get('error') or 'unknown'})"]
    if torch.get("cuda"):
        build = f"CUDA {torch['cuda']}"
    else:
        build = "ROCm " + torch["hip"] if torch.get("hip") else "CPU-only build"
    lines = [f"{torch['version']} ({build}; cuDNN {torch.get('cudnn') or '-'})"]
    if torch.get("cuda") or torch.get("cuda_available"):
        visible = torch.get("cuda_visible_devices")
        lines.append(f"cuda available: {_yes_no(torch.get('cuda_available'))}, "
                     f"devices: {torch.get('cuda_device_count')}"
                     + (f" (CUDA_VISIBLE_DEVICES={visible})" if visible is not None else ""))
        lines += [f"cuda:{i} {d.get('name')}, {format_bytes(d.get('memory_bytes'))}, {d.get('uuid') or '?'}"
                  for i, d in enumerate(torch.get("cuda_devices") or [])]
    lines.append(
        f"threads {torch.get('num_threads')}, mkldnn {_yes_no(torch.get('mkldnn'))}, "
        f"openmp {_yes_no(torch.get('openmp'))}"
    )
    return lines


def _backend_lines(doc: Mapping[str, Any]) -> list[str]:
    errors = doc.get("backend_errors") or {}
    lines = []
    for name, ok in (doc.get("backends") or {}).items():
        lines.append(f"{name}: yes" if ok else f"{name}: no ({errors.get(name, 'unknown')})")
    return lines


def render_text(doc: Mapping[str, Any]) -> str:
    """A readable multi-line report; plain text so the CLI may colour it."""
    mem = doc.get("memory") or {}
    comp = doc.get("compile") or {}
    ipex = doc.get("ipex") or {}
    allocs = doc.get("allocators") or {}
    omp = doc.get("openmp") or {}
    tools = doc.get("tools") or {}
    lines: list[str] = []
    lines += _section("CPU", _cpu_lines(doc.get("cpu") or {}))
    lines += _section("Memory", [
        f"total {format_bytes(mem.get('total_bytes'))}, available {format_bytes(mem.get('available_bytes'))}",
        f"cgroup limit {format_bytes(mem.get('cgroup_limit_bytes'))}, usable {format_bytes(mem.get('usable_bytes'))}",
        f"/dev/shm {format_bytes(mem.get('shm_bytes'))}",
    ])
    lines += _section("GPUs", _gpu_lines(doc))
    lines += _section("Torch", _torch_lines(doc))
    lines += _section("Backends", _backend_lines(doc))
    lines += _section("Compile", [
        f"available ({comp.get('compiler')})" if comp.get("available")
        else f"unavailable ({comp.get('reason')})"
    ])
    if ipex.get("installed"):
        state = "(compatible)" if ipex.get("compatible") else f"(incompatible: {ipex.get('reason')})"
        ipex_line = f"{ipex.get('version')} {state}"
    else:
        ipex_line = ipex.get("reason") or "not installed"
    lines += _section("IPEX", [ipex_line])
    lines += _section("Libraries", [
        f"{name}: {_path(path)}" for name, path in {**allocs, **omp}.items()
    ])
    lines += _section("Tools", [f"{name}: {_path(path)}" for name, path in tools.items()])
    if doc.get("warnings"):
        lines += _section("Warnings", list(doc["warnings"]))
    footer = f"fingerprint {fingerprint_id(doc)}"
    if doc.get("probe_seconds") is not None:
        footer += f", probed in {doc['probe_seconds']:.2f} s"
    lines += _section("Machine", [footer])
    return "\n".join(lines) + "\n"
