"""The torch build, the GPUs CUDA enumerates and which distributed backends form a 1-rank
group, read by a script in a child interpreter (``probes.child``) bound to loopback."""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import subprocess
from dataclasses import dataclass

from autotune.schemas import typed

from . import _io
from .child import LOOPBACK_ENV, child_failure, child_python_argv
from .gpu import torch_device
from .torch_build import TorchBuild

BACKENDS = ("gloo", "nccl", "mpi", "ccl")

TORCH_PROBE_TIMEOUT_S = 90.0  # a cold first import of torch can take tens of seconds

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
def one_rank(name, device, on_gpu):
    dist.init_process_group(name, store=dist.HashStore(), rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=20))
    try:
        t = torch.ones(1, device=device)
        dist.all_reduce(t)
        if on_gpu:
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
    return one_rank("gloo", "cpu", False)
def nccl():
    if not have_dist:
        return "torch.distributed not available in this build"
    if not dist.is_nccl_available():
        return "torch built without NCCL"
    if not info["cuda_device_count"]:
        return "no CUDA GPUs visible to torch"
    torch.cuda.set_device(0)
    return one_rank("nccl", "cuda:0", True)
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


@dataclass
class TorchFacts:
    torch: TorchBuild
    backends: dict[str, bool]
    backend_errors: dict[str, str]


def parse_torch_probe_output(stdout: str, *, returncode: int | None, stderr: str = "") -> TorchFacts:
    """JSON lines from TORCH_PROBE_SCRIPT -> facts.  Pure.

    The child prints one line per finding as it goes, so a crash part-way
    (a backend that segfaults) still leaves everything found before it.
    """
    torch: TorchBuild | None = None
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
            raw_devices = record.pop("cuda_devices", None) or []
            torch = dataclasses.replace(
                typed.read(TorchBuild, record),
                cuda_devices=tuple(torch_device(d) for d in raw_devices if isinstance(d, dict)))
        elif kind == "backend" and record.get("name") in BACKENDS:
            backends[record["name"]] = bool(record.get("ok"))
            if not record.get("ok"):
                errors[record["name"]] = str(record.get("error") or "failed")
    died = child_failure(returncode, stderr)
    if torch is None:
        torch = TorchBuild(error=died or "torch probe produced no output")
    for name in ("gloo", "nccl", "mpi"):
        if name not in backends:
            backends[name] = False
            errors[name] = torch.error or died or "not checked"
    return TorchFacts(torch=torch, backends=backends, backend_errors=errors)


def probe_torch(*, run: _io.Runner = subprocess.run, timeout: float = TORCH_PROBE_TIMEOUT_S) -> TorchFacts:
    """The torch build and which distributed backends form a 1-rank group, found by
    TORCH_PROBE_SCRIPT in a child bound to loopback."""
    if importlib.util.find_spec("torch") is None:
        facts = parse_torch_probe_output("", returncode=0)
        facts.torch = dataclasses.replace(facts.torch, error="torch not installed")
        facts.backend_errors.update({b: "torch not installed" for b in ("gloo", "nccl", "mpi")})
        return facts
    env = {**os.environ, **LOOPBACK_ENV}
    # The order trials see (launch.environment sets it), unless the user chose one.
    env.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    rc, out, err = _io.run_text(child_python_argv(TORCH_PROBE_SCRIPT), run=run, timeout=timeout, env=env)
    return parse_torch_probe_output(out, returncode=rc, stderr=err)
