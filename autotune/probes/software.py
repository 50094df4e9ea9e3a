"""Software stack: torch build, distributed backends, torch.compile's C++
toolchain, IPEX, allocators, OpenMP runtime and pinning tools, read together.

Each part lives in its own module (torch_probe, extensions, compiler, libraries);
the slow ones run in child interpreters (``probes.child``), concurrently.
"""
from __future__ import annotations

import subprocess
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from . import _io
from .compiler import CompilerCheck, check_compiler
from .extensions import IpexStatus, probe_ccl, probe_ipex
from .libraries import ALLOCATOR_NAMES, find_native_libraries, find_tools, read_ldconfig
from .torch_build import TorchBuild
from .torch_probe import BACKENDS, probe_torch

T = TypeVar("T")


@dataclass
class SoftwareInfo:
    torch: TorchBuild
    backends: dict[str, bool]
    backend_errors: dict[str, str]
    compile: CompilerCheck
    ipex: IpexStatus
    allocators: dict[str, str | None]
    openmp: dict[str, str | None]
    tools: dict[str, str | None]
    timings: dict[str, float] = field(default_factory=dict)


def skipped_software(reason: str = "skipped") -> SoftwareInfo:
    """SoftwareInfo with nothing available, each entry giving ``reason``: what a machine
    probe reports when it does not probe software (a fake root of captured files)."""
    return SoftwareInfo(
        torch=TorchBuild(error=reason or None),
        backends={b: False for b in BACKENDS},
        backend_errors={b: reason for b in BACKENDS},
        compile=CompilerCheck(available=False, compiler=None, reason=reason),
        ipex=IpexStatus(installed=False, compatible=False, version=None, reason=reason),
        allocators={name: None for name in ALLOCATOR_NAMES},
        openmp={"iomp5": None},
        tools={"numactl": None, "taskset": None},
    )


def read_software(*, run: _io.Runner = subprocess.run, pool: ThreadPoolExecutor | None = None) -> SoftwareInfo:
    """All software facts.  The slow parts (torch child, test compile,
    extension children) run concurrently; the wall time is about one torch
    import."""
    own_pool = pool is None
    pool = pool or ThreadPoolExecutor(max_workers=4, thread_name_prefix="probe")
    try:
        f_torch = pool.submit(_timed, probe_torch, run=run)
        f_compile = pool.submit(_timed, check_compiler, run=run)
        f_ipex = pool.submit(_timed, probe_ipex, run=run)
        f_ccl = pool.submit(_timed, probe_ccl, run=run)
        ldconfig = read_ldconfig(run=run)
        allocators, openmp = find_native_libraries(ldconfig=ldconfig)
        tools = find_tools()
        (facts, t_torch), (compile_doc, t_compile) = f_torch.result(), f_compile.result()
        (ipex, t_ipex), ((ccl_ok, ccl_reason), t_ccl) = f_ipex.result(), f_ccl.result()
    finally:
        if own_pool:
            pool.shutdown(wait=True)
    backends = {**facts.backends, "ccl": ccl_ok}
    errors = dict(facts.backend_errors)
    if ccl_reason:
        errors["ccl"] = ccl_reason
    return SoftwareInfo(
        torch=facts.torch,
        backends={b: backends.get(b, False) for b in BACKENDS},
        backend_errors=errors,
        compile=compile_doc,
        ipex=ipex,
        allocators=allocators,
        openmp=openmp,
        tools=tools,
        timings={"torch_s": t_torch, "compile_s": t_compile, "ipex_s": t_ipex, "ccl_s": t_ccl},
    )


def _timed(fn: Callable[..., T], **kwargs: Any) -> tuple[T, float]:
    """``fn(**kwargs)`` and the seconds it took."""
    import time

    start = time.perf_counter()
    result = fn(**kwargs)
    return result, round(time.perf_counter() - start, 3)
