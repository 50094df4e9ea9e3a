"""Software stack: torch build, distributed backends, torch.compile's C++
toolchain, IPEX, allocators, OpenMP runtime and pinning tools.

Anything that imports torch or its extensions runs in a child interpreter:
torch costs ~2 s to import, a broken extension can segfault, and a
mismatched IPEX calls exit() on import.  The common "not installed" cases
are answered from package metadata without starting a process.
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from . import _io
from .gpu import torch_device

BACKENDS = ("gloo", "nccl", "mpi", "ccl")

# Versioned names count: distro packages often ship only the runtime
# soname (libjemalloc.so.2) without the -dev symlink.
ALLOCATOR_NAMES: dict[str, tuple[str, ...]] = {
    "jemalloc": ("libjemalloc.so", "libjemalloc.so.2"),
    "tcmalloc": ("libtcmalloc.so", "libtcmalloc.so.4", "libtcmalloc_minimal.so", "libtcmalloc_minimal.so.4"),
}
IOMP_NAMES = ("libiomp5.so",)

TORCH_PROBE_TIMEOUT_S = 90.0  # a cold first import of torch can take tens of seconds
COMPILE_TIMEOUT_S = 20.0
EXTENSION_TIMEOUT_S = 60.0

# Children bind only to loopback: gloo and NCCL pick their listening
# interface from these, and the store is in-memory (HashStore) because
# TCPStore's server listens on every interface whatever host it is given.
LOOPBACK_ENV = {"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo"}

TORCH_PROBE_SCRIPT = r"""
import json, sys
def emit(kind, **kw):
    kw["kind"] = kind
    print(json.dumps(kw), flush=True)
def err(e):
    return (type(e).__name__ + ": " + str(e)).strip()[:300]
try:
    import torch
except BaseException as e:
    emit("torch", error=err(e))
    raise SystemExit(0)
import os
info = {"version": torch.__version__, "cuda": torch.version.cuda,
        "hip": getattr(torch.version, "hip", None), "cudnn": None,
        "cuda_available": False, "cuda_device_count": 0, "cuda_devices": [],
        "mkldnn": None, "openmp": None, "num_threads": None,
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}
try:
    if torch.backends.cudnn.is_available():
        v = torch.backends.cudnn.version()
        if v is not None:
            # cuDNN 9 encodes 9.1.0 as 90100, cuDNN <= 8 encodes 8.9.2 as 8902.
            major, rest = divmod(v, 10000) if v >= 90000 else divmod(v, 1000)
            info["cudnn"] = "%d.%d.%d" % (major, rest // 100, rest % 100)
except BaseException:
    pass
try:
    info["cuda_available"] = bool(torch.cuda.is_available())
    info["cuda_device_count"] = int(torch.cuda.device_count()) if info["cuda_available"] else 0
    for i in range(info["cuda_device_count"]):
        major, minor = torch.cuda.get_device_capability(i)
        props = torch.cuda.get_device_properties(i)
        uuid = getattr(props, "uuid", None)
        pci = [getattr(props, k, None) for k in ("pci_domain_id", "pci_bus_id", "pci_device_id")]
        bus_id = None
        if None in pci:
            # Builds whose device properties lack the PCI numbers: ask the CUDA runtime
            # torch has loaded.
            try:
                import ctypes
                rt = ctypes.CDLL("libcudart.so." + torch.version.cuda.split(".")[0])
                buf = ctypes.create_string_buffer(32)
                if rt.cudaDeviceGetPCIBusId(buf, 32, i) == 0:
                    bus_id = buf.value.decode()
            except BaseException:
                pass
        info["cuda_devices"].append({"name": torch.cuda.get_device_name(i),
                                     "compute_capability": "%d.%d" % (major, minor),
                                     "memory_bytes": int(props.total_memory),
                                     "uuid": str(uuid) if uuid is not None else None,
                                     "pci": pci if None not in pci else None,
                                     "pci_bus_id": bus_id})
except BaseException as e:
    info["cuda_error"] = err(e)
try:
    info["mkldnn"] = bool(torch.backends.mkldnn.is_available())
    info["openmp"] = bool(torch.backends.openmp.is_available())
    info["num_threads"] = int(torch.get_num_threads())
except BaseException:
    pass
emit("torch", **info)

import datetime
try:
    import torch.distributed as dist
    have_dist = dist.is_available()
except BaseException:
    have_dist = False
def backend(name, check):
    try:
        reason = check()
        emit("backend", name=name, ok=reason is None, error=reason)
    except BaseException as e:
        emit("backend", name=name, ok=False, error=err(e))
        try:
            if dist.is_initialized():
                dist.destroy_process_group()
        except BaseException:
            pass
def one_rank(name, device):
    dist.init_process_group(name, store=dist.HashStore(), rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=20))
    try:
        t = torch.ones(1, device=device)
        dist.all_reduce(t)
        if device != "cpu":
            torch.cuda.synchronize()
        if float(t.item()) != 1.0:
            return "all_reduce returned a wrong value"
    finally:
        dist.destroy_process_group()
    return None
def gloo():
    if not have_dist:
        return "torch.distributed not available in this build"
    if not dist.is_gloo_available():
        return "torch built without gloo"
    return one_rank("gloo", "cpu")
def nccl():
    if not have_dist:
        return "torch.distributed not available in this build"
    if not dist.is_nccl_available():
        return "torch built without NCCL"
    if not info["cuda_device_count"]:
        return "no CUDA GPUs visible to torch"
    torch.cuda.set_device(0)
    return one_rank("nccl", "cuda:0")
def mpi():
    if not have_dist:
        return "torch.distributed not available in this build"
    return None if dist.is_mpi_available() else "torch built without MPI"
backend("gloo", gloo)
backend("nccl", nccl)
backend("mpi", mpi)
# Skip interpreter teardown: unloading torch costs ~1 s and nothing is left to flush.
sys.stdout.flush()
import os
os._exit(0)
"""

CCL_PROBE_SCRIPT = r"""
import torch, oneccl_bindings_for_pytorch
import torch.distributed as dist
print("ccl" in [str(b).lower() for b in dist.Backend.backend_list])
"""

IPEX_PROBE_SCRIPT = r"""
import intel_extension_for_pytorch as ipex
print(ipex.__version__)
"""

CXX_PROBE_SOURCE = r"""
#include <Python.h>
#include <omp.h>
extern "C" int probe_sum(int n) {
  int s = 0;
#pragma omp parallel for reduction(+:s)
  for (int i = 0; i < n; ++i) s += i;
  return s + omp_get_max_threads() * 0;
}
"""


def child_python_argv(script: str, *, python: str = sys.executable) -> list[str]:
    """The command line that runs ``script`` in a fresh interpreter."""
    # -P keeps the current directory off sys.path, so a stray torch.py in
    # the user's cwd cannot shadow the real package.
    flags = ["-P"] if sys.version_info >= (3, 11) else []
    return [python, *flags, "-c", script]


# ---------------------------------------------------------------- torch

@dataclass
class TorchFacts:
    torch: dict[str, Any]
    backends: dict[str, bool]
    backend_errors: dict[str, str]


def empty_torch(error: str | None = None) -> dict[str, Any]:
    """The torch facts when nothing could be learnt, with ``error`` saying why."""
    doc: dict[str, Any] = {
        "version": None, "cuda": None, "hip": None, "cudnn": None,
        "cuda_available": False, "cuda_device_count": 0, "cuda_devices": [],
        "mkldnn": None, "openmp": None, "num_threads": None, "cuda_visible_devices": None,
    }
    if error:
        doc["error"] = error
    return doc


def parse_torch_probe_output(stdout: str, *, returncode: int | None, stderr: str = "") -> TorchFacts:
    """JSON lines from TORCH_PROBE_SCRIPT -> facts.  Pure.

    The child prints one line per finding as it goes, so a crash part-way
    (a backend that segfaults) still leaves everything found before it.
    """
    torch_doc: dict[str, Any] | None = None
    backends: dict[str, bool] = {}
    errors: dict[str, str] = {}
    for line in stdout.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if not isinstance(record, dict):
            continue
        kind = record.pop("kind", None)
        if kind == "torch":
            torch_doc = {**empty_torch(), **record}
            torch_doc["cuda_devices"] = [torch_device(d) for d in torch_doc.get("cuda_devices") or []
                                         if isinstance(d, dict)]
        elif kind == "backend" and record.get("name") in BACKENDS:
            backends[record["name"]] = bool(record.get("ok"))
            if not record.get("ok"):
                errors[record["name"]] = str(record.get("error") or "failed")
    died = _child_failure(returncode, stderr)
    if torch_doc is None:
        torch_doc = empty_torch(died or "torch probe produced no output")
    for name in ("gloo", "nccl", "mpi"):
        if name not in backends:
            backends[name] = False
            errors[name] = torch_doc.get("error") or died or "not checked"
    return TorchFacts(torch=torch_doc, backends=backends, backend_errors=errors)


def _child_failure(returncode: int | None, stderr: str) -> str | None:
    """Why a probe child failed (its exit status and last stderr line), or None if it
    exited with 0; a return code of None means it did not finish."""
    if returncode == 0:
        return None
    tail = _io.last_line(stderr)
    what = "probe subprocess did not finish" if returncode is None else f"probe subprocess exited with {returncode}"
    return f"{what}: {tail}" if tail else what


def probe_torch(*, run: _io.Runner = subprocess.run, timeout: float = TORCH_PROBE_TIMEOUT_S) -> TorchFacts:
    """The torch build and which distributed backends form a 1-rank group, found by
    TORCH_PROBE_SCRIPT in a child bound to loopback."""
    if importlib.util.find_spec("torch") is None:
        facts = parse_torch_probe_output("", returncode=0)
        facts.torch["error"] = "torch not installed"
        facts.backend_errors.update({b: "torch not installed" for b in ("gloo", "nccl", "mpi")})
        return facts
    env = {**os.environ, **LOOPBACK_ENV}
    # The order trials see (launch.environment sets it), unless the user chose one.
    env.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    rc, out, err = _io.run_text(child_python_argv(TORCH_PROBE_SCRIPT), run=run, timeout=timeout, env=env)
    return parse_torch_probe_output(out, returncode=rc, stderr=err)


def probe_ccl(
    *, run: _io.Runner = subprocess.run, find_spec: Callable[[str], Any] = importlib.util.find_spec
) -> tuple[bool, str | None]:
    """(usable, reason).  Import-only: a 1-rank oneCCL group would need its
    own KVS and transport configured to stay on loopback."""
    if _safe_find_spec(find_spec, "oneccl_bindings_for_pytorch") is None:
        return False, "oneccl_bindings_for_pytorch not installed"
    rc, out, err = _io.run_text(
        child_python_argv(CCL_PROBE_SCRIPT), run=run, timeout=EXTENSION_TIMEOUT_S, env={**os.environ, **LOOPBACK_ENV}
    )
    if rc == 0 and out.strip().endswith("True"):
        return True, None
    if rc == 0:
        return False, "oneccl_bindings_for_pytorch imported but did not register the ccl backend"
    return False, _child_failure(rc, err or out) or "import failed"


# ---------------------------------------------------------------- IPEX

def probe_ipex(
    *,
    run: _io.Runner = subprocess.run,
    find_spec: Callable[[str], Any] = importlib.util.find_spec,
    version_of: Callable[[str], str] = importlib.metadata.version,
) -> dict[str, Any]:
    """Never imported here: a mismatched IPEX prints an error and calls
    exit() on import, which would take the caller down with it."""
    if _safe_find_spec(find_spec, "intel_extension_for_pytorch") is None:
        return {"installed": False, "compatible": False, "version": None, "reason": "not installed"}
    version = None
    for dist_name in ("intel_extension_for_pytorch", "intel-extension-for-pytorch"):
        try:
            version = version_of(dist_name)
            break
        except Exception:
            continue
    rc, out, err = _io.run_text(child_python_argv(IPEX_PROBE_SCRIPT), run=run, timeout=EXTENSION_TIMEOUT_S)
    if rc == 0:
        return {"installed": True, "compatible": True, "version": _io.last_line(out) or version, "reason": None}
    # IPEX's own mismatch message goes to stdout or stderr depending on version.
    reason = _io.last_line(err) or _io.last_line(out) or f"import exited with {rc}"
    return {"installed": True, "compatible": False, "version": version, "reason": reason}


def _safe_find_spec(find_spec: Callable[[str], Any], name: str) -> Any:
    try:
        return find_spec(name)
    except (ImportError, ValueError):
        return None


# ---------------------------------------------------------------- compiler

def choose_compiler(env: Mapping[str, str], which: Callable[[str], str | None]) -> tuple[str | None, str | None]:
    """(compiler path, reason it can't serve torch.compile or None).  Pure
    given ``which``.

    Inductor on Linux runs exactly $CXX, else g++ (torch/_inductor/config.py
    cpp.cxx), with no further search: a c++ or clang++ that merely exists is
    reported, but with a reason, because torch.compile will not find it.
    """
    cxx = env.get("CXX")
    if cxx:
        path = which(cxx)
        if path:
            return path, None
        fallback = next((p for p in (which(n) for n in ("g++", "c++", "clang++")) if p), None)
        return fallback, f"CXX={cxx} not found; torch.compile uses $CXX and will fail"
    gxx = which("g++")
    if gxx:
        return gxx, None
    other = next((p for p in (which(n) for n in ("c++", "clang++")) if p), None)
    if other:
        return other, f"g++ not found; torch.compile looks only for $CXX or g++ (set CXX={other})"
    return None, "no C++ compiler found ($CXX, g++, c++, clang++)"


def compile_command(compiler: str, source: str, output: str, *, python_include: str | None) -> list[str]:
    """Mirrors what inductor's C++ kernels need: C++17, a shared object,
    OpenMP (-fopenmp, gomp) and Python.h (kernels are Python extensions)."""
    argv = [compiler, "-std=c++17", "-O0", "-shared", "-fPIC", "-fopenmp"]
    if python_include:
        argv.append(f"-I{python_include}")
    return argv + [source, "-o", output, "-lgomp"]


def check_compiler(
    *,
    run: _io.Runner = subprocess.run,
    env: Mapping[str, str] | None = None,
    which: Callable[[str], str | None] = shutil.which,
    timeout: float = COMPILE_TIMEOUT_S,
) -> dict[str, Any]:
    """Can torch.compile build CPU kernels here?  Actually compiles a tiny
    OpenMP + Python.h shared object, since a compiler binary alone says
    nothing about missing headers or libgomp."""
    env = dict(os.environ if env is None else env)
    compiler, reason = choose_compiler(env, which)
    if compiler is None or reason is not None:
        return {"available": False, "compiler": compiler, "reason": reason}
    include = sysconfig.get_paths().get("include")
    if not include or not os.path.exists(os.path.join(include, "Python.h")):
        return {"available": False, "compiler": compiler,
                "reason": f"Python.h not found in {include} (install the python dev headers)"}
    with tempfile.TemporaryDirectory(prefix="autotune-cxx-") as tmp:
        source = os.path.join(tmp, "probe.cpp")
        with open(source, "w", encoding="utf-8") as fh:
            fh.write(CXX_PROBE_SOURCE)
        argv = compile_command(compiler, source, os.path.join(tmp, "probe.so"), python_include=include)
        rc, out, err = _io.run_text(argv, run=run, timeout=timeout, cwd=tmp)
    if rc == 0:
        return {"available": True, "compiler": compiler, "reason": None}
    detail = _first_error_line(err or out) or (f"exit status {rc}" if rc is not None else "did not finish")
    return {"available": False, "compiler": compiler, "reason": f"test compile failed: {detail}"}


def _first_error_line(text: str) -> str:
    for line in text.splitlines():
        if "error" in line.lower():
            return line.strip()[:300]
    return _io.last_line(text)


# ---------------------------------------------------------------- libraries

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


# ---------------------------------------------------------------- together

@dataclass
class SoftwareInfo:
    torch: dict[str, Any]
    backends: dict[str, bool]
    backend_errors: dict[str, str]
    compile: dict[str, Any]
    ipex: dict[str, Any]
    allocators: dict[str, str | None]
    openmp: dict[str, str | None]
    tools: dict[str, str | None]
    timings: dict[str, float] = field(default_factory=dict)


def skipped_software(reason: str = "skipped") -> SoftwareInfo:
    """SoftwareInfo with nothing available, each entry giving ``reason``: what a machine
    probe reports when it does not probe software (a fake root of captured files)."""
    return SoftwareInfo(
        torch=empty_torch(reason),
        backends={b: False for b in BACKENDS},
        backend_errors={b: reason for b in BACKENDS},
        compile={"available": False, "compiler": None, "reason": reason},
        ipex={"installed": False, "compatible": False, "version": None, "reason": reason},
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


def _timed(fn: Callable[..., Any], **kwargs: Any) -> tuple[Any, float]:
    """``fn(**kwargs)`` and the seconds it took."""
    import time

    start = time.perf_counter()
    result = fn(**kwargs)
    return result, round(time.perf_counter() - start, 3)
