"""Plain-text report of a probe document (``autotune probe``)."""
from __future__ import annotations

from typing import Any

from ._machine import Machine, MachineLike, as_machine
from .cpu import CpuInfo
from .cpu_text import format_cpulist
from .fingerprint import fingerprint_id
from .torch_build import TorchBuild
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


def _cpu_lines(cpu: CpuInfo) -> list[str]:
    sockets = cpu.sockets
    lines = [
        f"{cpu.model or 'unknown model'} ({cpu.vendor or '?'}, {cpu.arch or '?'})",
        f"{sockets} socket{'s' if sockets != 1 else ''}, {cpu.physical_cores} physical cores, "
        f"{cpu.logical_cores} logical ({cpu.threads_per_core} thread(s)/core)",
    ]
    limit = cpu.cgroup_cpu_limit
    quota = f"cgroup quota {limit:g} cores" if limit is not None else "no cgroup quota"
    lines.append(f"usable: {cpu.usable_cores} cores (affinity {format_cpulist(cpu.usable_cpus)}; {quota})")
    lines.append("NUMA: " + ("; ".join(f"node{n} {format_cpulist(c) or '(no cpus)'}"
                                       for n, c in cpu.numa_nodes.items()) or "-"))
    if cpu.caches:
        parts = []
        for level, c in cpu.caches.items():
            count = f" x{c['instances']}" if c.get("instances") else ""
            parts.append(f"{level.upper()} {format_bytes(c.get('size_bytes'))}{count}")
        lines.append("caches: " + ", ".join(parts))
    isa = [flag for flag, present in cpu.isa.items() if present]
    lines.append("ISA: " + (" ".join(isa) or "none of the tracked extensions"))
    return lines


def _gpu_lines(machine: Machine) -> list[str]:
    if not machine.gpus:
        return [f"none ({machine.gpu_error})" if machine.gpu_error else "none"]
    lines = []
    for g in machine.gpus:
        line = f"{g.index}: {g.name}, {format_bytes(g.memory_bytes)}, sm {g.compute_capability or '?'}"
        if g.compute_mode:
            line += f", compute mode {g.compute_mode}"
        if g.mig:
            line += f", MIG on ({len(g.mig_devices)} instance(s))"
        if g.processes:
            line += f", {g.processes} other process(es)"
        lines.append(line)
        lines += [f"   MIG {m.index}: {m.name}, {format_bytes(m.memory_bytes)}, {m.uuid}" for m in g.mig_devices]
    for link in machine.gpu_links:
        kind = "NVLink" if link.nvlink else f"p2p {link.p2p or '?'}"
        lines.append(f"{link.a}<->{link.b}: {kind}, topology {link.topology or '?'}")
    if machine.driver.get("version"):
        lines.append(f"driver {machine.driver['version']} (CUDA {machine.driver.get('cuda_driver_version') or '?'})")
    return lines


def _torch_lines(torch: TorchBuild) -> list[str]:
    if not torch.version:
        return [f"not available ({torch.error or 'unknown'})"]
    if torch.cuda:
        build = f"CUDA {torch.cuda}"
    else:
        build = f"ROCm {torch.hip}" if torch.hip else "CPU-only build"
    lines = [f"{torch.version} ({build}; cuDNN {torch.cudnn or '-'})"]
    if torch.cuda or torch.cuda_available:
        visible = torch.cuda_visible_devices
        lines.append(f"cuda available: {_yes_no(torch.cuda_available)}, devices: {torch.cuda_device_count}"
                     + (f" (CUDA_VISIBLE_DEVICES={visible})" if visible is not None else ""))
        lines += [f"cuda:{i} {d.name}, {format_bytes(d.memory_bytes)}, {d.uuid or '?'}"
                  for i, d in enumerate(torch.cuda_devices)]
    lines.append(f"threads {torch.num_threads}, mkldnn {_yes_no(torch.mkldnn)}, openmp {_yes_no(torch.openmp)}")
    return lines


def _backend_lines(machine: Machine) -> list[str]:
    return [f"{name}: yes" if ok else f"{name}: no ({machine.backend_errors.get(name, 'unknown')})"
            for name, ok in machine.backends.items()]


def render_text(doc: MachineLike) -> str:
    """A readable multi-line report of a machine (or its probe document); plain text so
    the CLI may colour it."""
    machine = as_machine(doc)
    mem, comp, ipex = machine.memory, machine.compile, machine.ipex
    lines: list[str] = []
    lines += _section("CPU", _cpu_lines(machine.cpu))
    lines += _section("Memory", [
        f"total {format_bytes(mem.total_bytes)}, available {format_bytes(mem.available_bytes)}",
        f"cgroup limit {format_bytes(mem.cgroup_limit_bytes)}, usable {format_bytes(mem.usable_bytes)}",
        f"/dev/shm {format_bytes(mem.shm_bytes)}",
    ])
    lines += _section("GPUs", _gpu_lines(machine))
    lines += _section("Torch", _torch_lines(machine.torch))
    lines += _section("Backends", _backend_lines(machine))
    lines += _section("Compile", [f"available ({comp.compiler})" if comp.available else f"unavailable ({comp.reason})"])
    if ipex.installed:
        state = "(compatible)" if ipex.compatible else f"(incompatible: {ipex.reason})"
        ipex_line = f"{ipex.version} {state}"
    else:
        ipex_line = ipex.reason or "not installed"
    lines += _section("IPEX", [ipex_line])
    lines += _section("Libraries", [
        f"{name}: {_path(path)}" for name, path in {**machine.allocators, **machine.openmp}.items()
    ])
    lines += _section("Tools", [f"{name}: {_path(path)}" for name, path in machine.tools.items()])
    if machine.warnings:
        lines += _section("Warnings", list(machine.warnings))
    footer = f"fingerprint {fingerprint_id(machine.to_json())}"
    if machine.probe_seconds is not None:
        footer += f", probed in {machine.probe_seconds:.2f} s"
    lines += _section("Machine", [footer])
    return "\n".join(lines) + "\n"
