"""Machine: every probe's result in one JSON-able document."""
from __future__ import annotations

import os
import platform
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeAlias

from pydantic import model_validator

from autotune.runtime.json_value import JsonValue
from autotune.schemas.typed import Record

from . import _io
from . import software as sw_mod
from .compiler import CompilerCheck
from .cpu import CpuInfo, given_cpu, read_cpu
from .extensions import IpexStatus
from .gpu import GpuInfo, GpuLink, GpuProbe, cross_check_torch
from .host_memory import MemoryInfo, read_memory
from .nvml import read_gpu_processes, read_gpus
from .torch_build import TorchBuild
from .units import format_bytes

SCHEMA_VERSION = 1


@dataclass
class Machine(Record):
    cpu: CpuInfo
    memory: MemoryInfo
    gpus: list[GpuInfo] = field(default_factory=list)
    gpu_links: list[GpuLink] = field(default_factory=list)
    gpu_error: str | None = None
    driver: dict[str, str | None] = field(default_factory=dict)  # NVML's version and CUDA driver version
    torch: TorchBuild = field(default_factory=TorchBuild)
    backends: dict[str, bool] = field(default_factory=dict)
    backend_errors: Mapping[str, str | None] = field(default_factory=dict)  # records may hold null
    compile: CompilerCheck = field(default_factory=CompilerCheck)
    allocators: dict[str, str | None] = field(default_factory=dict)
    openmp: dict[str, str | None] = field(default_factory=dict)
    ipex: IpexStatus = field(default_factory=IpexStatus)
    tools: dict[str, str | None] = field(default_factory=dict)
    host: dict[str, str] = field(default_factory=dict)  # who probed: hostname, OS, Python; or the fake root
    warnings: list[str] = field(default_factory=list)
    probe_seconds: float | None = None
    timings: dict[str, float] = field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION

    @model_validator(mode="before")
    @classmethod
    def _given(cls, doc: Any) -> Any:
        """A saved document (e.g. a tuning record's machine) as far as it goes: what it
        lacks reads as not probed, and a section that is null as an empty one."""
        if not isinstance(doc, Mapping):
            return doc
        given = {k: v for k, v in doc.items() if v is not None or k in _NULLABLE}
        given["cpu"] = given_cpu(doc.get("cpu") or {})
        given["memory"] = doc.get("memory") or {}
        return given


# the sections a probe writes as null where it learnt nothing (the others read null as empty)
_NULLABLE = frozenset({"gpu_error", "probe_seconds"})


def probe_machine(
    *,
    root: str = "/",
    run: _io.Runner = subprocess.run,
    nvml: Any = None,
    software: bool | None = None,
) -> Machine:
    """Probe this machine (``root="/"``) or a fake root of captured files: the CPUs and
    memory this process may use, the GPUs NVML sees, and the software trials would run
    with (torch, its backends, compilers, allocators; read in a child interpreter).

    What cannot be read is recorded rather than raised: NVML missing in ``gpu_error``, a
    backend that fails in ``backend_errors``, a state that makes timings unreliable (a
    small /dev/shm, GPUs other processes compute on) in ``warnings``.

    Args:
        root: ``"/"`` for this machine; otherwise a folder of captured files (``proc/``,
            ``sys/``, command output under ``_commands/``), as tests/probes/fixtures.
        run: replaces ``subprocess.run`` for every command a probe runs.
        nvml: replaces the pynvml module. GPUs of a fake root are probed only through it.
        software: whether to read torch, compilers and libraries; by default only for
            the live root: *this* host's software says nothing about a fake root.

    Returns:
        The ``Machine``; its ``to_dict()`` is the document behind ``autotune probe --json``
        and the fingerprint a tuned configuration records.
    """
    start = time.perf_counter()
    live = _io.is_live(root)
    want_software = live if software is None else software

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="probe-sw") as outer:
        # Software first: its torch child dominates wall time, so everything
        # else is read while it runs.
        sw_future = outer.submit(sw_mod.read_software, run=run) if want_software else None
        t0 = time.perf_counter()
        cpu = read_cpu(root, run=run)
        memory = read_memory(root)
        t_cpu_mem = time.perf_counter() - t0
        t0 = time.perf_counter()
        if nvml is None and not live:
            gpus = GpuProbe(error="not probed: fake root without an injected NVML")
        else:
            gpus = read_gpus(nvml)
        t_gpu = time.perf_counter() - t0
        sw = sw_future.result() if sw_future is not None else sw_mod.skipped_software()
    if gpus.gpus:
        # After the torch child has exited: its CUDA context is not someone else's work.
        counts = read_gpu_processes(nvml, own_pids=(os.getpid(),))
        for g in gpus.gpus:
            g.processes = counts.get(g.index) if counts is not None else None

    warnings = cross_check_torch(
        gpus.gpus,
        torch_cuda_build=sw.torch.cuda,
        torch_cuda_available=sw.torch.cuda_available if want_software else None,
        torch_device_count=sw.torch.cuda_device_count if want_software else None,
        cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
    ) + resource_warnings(memory, gpus.gpus)
    timings = {"cpu_memory_s": round(t_cpu_mem, 3), "gpu_s": round(t_gpu, 3), **sw.timings}
    return Machine(
        cpu=cpu,
        memory=memory,
        gpus=gpus.gpus,
        gpu_links=gpus.links,
        gpu_error=gpus.error,
        driver=gpus.driver,
        torch=sw.torch,
        backends=sw.backends,
        backend_errors=sw.backend_errors,
        compile=sw.compile,
        allocators=sw.allocators,
        openmp=sw.openmp,
        ipex=sw.ipex,
        tools=sw.tools,
        host=_host_facts() if live else {"root": os.path.abspath(root)},
        warnings=warnings,
        probe_seconds=round(time.perf_counter() - start, 3),
        timings=timings,
    )


SHM_WARN_BYTES = 1 << 30


def resource_warnings(memory: MemoryInfo, gpus: list[GpuInfo]) -> list[str]:
    """Warnings about this machine's state that make timings or trials unreliable:
    a small /dev/shm (Docker's default is 64 MiB) and GPUs other processes compute on."""
    warnings = []
    if memory.shm_bytes is not None and memory.shm_bytes < SHM_WARN_BYTES:
        warnings.append(
            f"/dev/shm is {format_bytes(memory.shm_bytes)}: DataLoader workers and NCCL's "
            "shared-memory transport need it; docker run --shm-size=16g (or more) raises it")
    busy = [g for g in gpus if g.processes]
    if busy:
        listed = ", ".join(f"GPU {g.index} ({g.processes})" for g in busy)
        warnings.append(f"other processes compute on {listed}: timings there are shared with them")
    return warnings


# A machine as its type, or as its probe document (a recorded probe of another machine, a
# tuning record's machine, a test's): what the stages take, read by ``as_machine``.
MachineLike: TypeAlias = "Machine | Mapping[str, JsonValue]"


def as_machine(machine: MachineLike) -> Machine:
    """The typed machine, from itself or from a saved probe document (a recorded probe
    of another machine, a tuning record's machine)."""
    return machine if isinstance(machine, Machine) else Machine.from_json(machine)


def _host_facts() -> dict[str, str]:
    return {
        "hostname": socket.gethostname(),
        "os": platform.system(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "python_executable": sys.executable,
    }



__all__ = ["Machine", "as_machine", "probe_machine"]
