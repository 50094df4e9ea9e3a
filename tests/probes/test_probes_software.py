from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from autotune.probes import compiler, extensions, libraries, torch_probe
from autotune.probes.compiler import choose_compiler
from autotune.probes.libraries import (
    find_library,
    find_native_libraries,
    ldconfig_arch_tag,
    library_search_dirs,
    parse_ldconfig_p,
)
from autotune.probes.torch_probe import parse_torch_probe_output
from autotune.schemas import typed

FIXTURES = Path(__file__).parent / "fixtures"


class FakeRun:
    """subprocess.run stand-in that records calls and replays one answer."""

    def __init__(self, *, returncode: int = 0, stdout: str = "", stderr: str = "", exc: Exception | None = None):
        self.result = subprocess.CompletedProcess([], returncode, stdout, stderr)
        self.exc = exc
        self.calls: list[list[str]] = []

    def __call__(self, argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        self.calls.append(list(argv))
        if self.exc is not None:
            raise self.exc
        return self.result


# ------------------------------------------------------------- ldconfig / libraries

def test_parse_ldconfig_real_output() -> None:
    entries = parse_ldconfig_p((FIXTURES / "local_epyc_kvm/_commands/ldconfig-p.txt").read_text())
    assert len(entries) == 17  # the "N libs found" header is not an entry
    gomp = next(e for e in entries if e.name == "libgomp.so.1")
    assert gomp.tags == ("libc6", "x86-64") and gomp.path == "/lib/x86_64-linux-gnu/libgomp.so.1"
    assert not any("jemalloc" in e.name for e in entries)


def test_parse_ldconfig_tags_with_abi_note() -> None:
    (entry,) = parse_ldconfig_p("\tlibc.so.6 (libc6,x86-64, OS ABI: Linux 3.2.0) => /lib/x86_64-linux-gnu/libc.so.6\n")
    assert entry.name == "libc.so.6" and "x86-64" in entry.tags


def test_ldconfig_finds_versioned_jemalloc_of_native_arch() -> None:
    entries = parse_ldconfig_p((FIXTURES / "intel_spr_2s/_commands/ldconfig-p.txt").read_text())
    allocators, openmp = find_native_libraries(
        env={}, ldconfig=entries, prefix="/nonexistent-env", machine="x86_64",
        exists={e.path for e in entries}.__contains__,
    )
    # The i386 libjemalloc.so.2 is listed first and must be skipped.
    assert allocators["jemalloc"] == "/lib/x86_64-linux-gnu/libjemalloc.so.2"
    assert allocators["tcmalloc"] == "/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"
    assert openmp["iomp5"] == "/opt/intel/oneapi/compiler/2024.0/lib/libiomp5.so"


def test_ld_library_path_wins_over_cache() -> None:
    entries = parse_ldconfig_p("\tlibjemalloc.so.2 (libc6,x86-64) => /lib/x86_64-linux-gnu/libjemalloc.so.2\n")
    present = {"/opt/jem/lib/libjemalloc.so", "/lib/x86_64-linux-gnu/libjemalloc.so.2"}
    allocators, _ = find_native_libraries(
        env={"LD_LIBRARY_PATH": "/opt/jem/lib"}, ldconfig=entries, prefix="/env", machine="x86_64",
        exists=present.__contains__,
    )
    assert allocators["jemalloc"] == "/opt/jem/lib/libjemalloc.so"


def test_multiarch_dirs_searched_when_cache_misses() -> None:
    present = {"/usr/lib/aarch64-linux-gnu/libtcmalloc.so.4"}
    allocators, openmp = find_native_libraries(
        env={}, ldconfig=[], prefix="/env", machine="aarch64", exists=present.__contains__
    )
    assert allocators == {"jemalloc": None, "tcmalloc": "/usr/lib/aarch64-linux-gnu/libtcmalloc.so.4"}
    assert openmp == {"iomp5": None}


def test_env_prefix_lib_is_searched() -> None:
    allocators, openmp = find_native_libraries(
        env={}, ldconfig=[], prefix="/opt/conda", machine="x86_64",
        exists={"/opt/conda/lib/libiomp5.so", "/opt/conda/lib/libjemalloc.so.2"}.__contains__,
    )
    assert openmp["iomp5"] == "/opt/conda/lib/libiomp5.so"
    assert allocators["jemalloc"] == "/opt/conda/lib/libjemalloc.so.2"


def test_search_dirs_include_multiarch_and_standard_locations() -> None:
    before, after = library_search_dirs(env={"LD_LIBRARY_PATH": "/a::/b"}, prefix="/env", machine="x86_64")
    assert before == ["/a", "/b", "/env/lib"]
    for d in ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/local/lib"):
        assert d in after
    assert ldconfig_arch_tag("aarch64") == "AArch64"


def test_find_library_misses_cleanly() -> None:
    assert find_library(["libnope.so"], before=["/x"], after=["/y"], exists=lambda p: False) is None


# ------------------------------------------------------------- compiler

def which_from(found: dict[str, str]):
    return lambda name: found.get(name)


def test_compiler_prefers_cxx_env() -> None:
    which = which_from({"clang++": "/usr/bin/clang++", "g++": "/usr/bin/g++"})
    path, reason = choose_compiler({"CXX": "clang++"}, which)
    assert (path, reason) == ("/usr/bin/clang++", None)


def test_missing_cxx_env_compiler_is_an_error_even_with_gxx() -> None:
    path, reason = choose_compiler({"CXX": "/opt/missing/g++"}, which_from({"g++": "/usr/bin/g++"}))
    assert path == "/usr/bin/g++" and reason and "CXX=/opt/missing/g++" in reason


def test_clang_only_is_reported_but_not_usable_by_inductor() -> None:
    path, reason = choose_compiler({}, which_from({"clang++": "/usr/bin/clang++"}))
    assert path == "/usr/bin/clang++" and reason and "CXX=" in reason


def test_no_compiler() -> None:
    assert choose_compiler({}, which_from({})) == (None, "no C++ compiler found ($CXX, g++, c++, clang++)")


def test_failed_test_compile_reports_first_error() -> None:
    run = FakeRun(returncode=1, stderr="probe.cpp:2:10: fatal error: omp.h: No such file or directory\n"
                                       "compilation terminated.\n")
    result = compiler.check_compiler(run=run, env={}, which=which_from({"g++": "/usr/bin/g++"}))
    assert result.available is False and result.compiler == "/usr/bin/g++"
    assert result.reason and "omp.h" in result.reason
    argv = run.calls[0]
    assert argv[0] == "/usr/bin/g++" and "-fopenmp" in argv and "-shared" in argv


def test_compile_timeout_is_not_available() -> None:
    run = FakeRun(exc=subprocess.TimeoutExpired(["g++"], 20))
    result = compiler.check_compiler(run=run, env={}, which=which_from({"g++": "/usr/bin/g++"}))
    assert result.available is False and result.reason and "timed out" in result.reason


# ------------------------------------------------------------- torch child

TORCH_LINE = json.dumps({"kind": "torch", "version": "2.13.0+cpu", "cuda": None, "cudnn": None,
                         "cuda_available": False, "cuda_device_count": 0})


def test_parse_torch_probe_output_complete() -> None:
    out = "\n".join([
        TORCH_LINE,
        json.dumps({"kind": "backend", "name": "gloo", "ok": True, "error": None}),
        json.dumps({"kind": "backend", "name": "nccl", "ok": False, "error": "no CUDA GPUs visible to torch"}),
        json.dumps({"kind": "backend", "name": "mpi", "ok": False, "error": "torch built without MPI"}),
    ])
    facts = parse_torch_probe_output(out, returncode=0)
    assert facts.torch.version == "2.13.0+cpu" and facts.torch.cuda is None
    assert facts.backends == {"gloo": True, "nccl": False, "mpi": False}
    assert facts.backend_errors == {"nccl": "no CUDA GPUs visible to torch", "mpi": "torch built without MPI"}


def test_parse_torch_probe_output_child_crashed_midway() -> None:
    out = TORCH_LINE + "\n" + json.dumps({"kind": "backend", "name": "gloo", "ok": True, "error": None}) + "\n"
    facts = parse_torch_probe_output(out, returncode=-11, stderr="Segmentation fault\n")
    assert facts.torch.version == "2.13.0+cpu" and facts.backends["gloo"] is True
    assert facts.backends["nccl"] is False and "exited with -11" in facts.backend_errors["nccl"]


def test_parse_torch_probe_output_import_failure() -> None:
    out = json.dumps({"kind": "torch", "error": "ImportError: libtorch_cpu.so: cannot open shared object file"})
    facts = parse_torch_probe_output(out, returncode=0)
    assert facts.torch.version is None and facts.torch.error and "libtorch_cpu" in facts.torch.error
    assert not any(facts.backends.values())


def test_probe_torch_timeout_keeps_partial_output() -> None:
    run = FakeRun(exc=subprocess.TimeoutExpired(["python"], 90, output=TORCH_LINE + "\n"))
    facts = torch_probe.probe_torch(run=run)
    assert facts.torch.version == "2.13.0+cpu"
    assert "did not finish" in facts.backend_errors["gloo"]


def test_probe_torch_child_binds_loopback_only() -> None:
    seen: dict[str, Any] = {}

    def run(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        seen.update(kwargs)
        return subprocess.CompletedProcess(argv, 0, TORCH_LINE, "")

    torch_probe.probe_torch(run=run)
    assert seen["env"]["GLOO_SOCKET_IFNAME"] == "lo" and seen["env"]["NCCL_SOCKET_IFNAME"] == "lo"
    assert "HashStore" in torch_probe.TORCH_PROBE_SCRIPT and "tcp://" not in torch_probe.TORCH_PROBE_SCRIPT


# ------------------------------------------------------------- IPEX / oneCCL

def test_ipex_not_installed_costs_no_subprocess() -> None:
    run = FakeRun()
    result = extensions.probe_ipex(run=run, find_spec=lambda name: None)
    assert typed.written(result) == {"installed": False, "compatible": False, "version": None, "reason": "not installed"}
    assert run.calls == []


def test_ipex_mismatch_is_caught_in_the_child() -> None:
    msg = ("ERROR! Intel® Extension for PyTorch* needs to work with PyTorch 2.1.*, but PyTorch 2.13.0+cpu "
           "is found. Please switch to the matching version and run again.")
    run = FakeRun(returncode=127, stdout=msg + "\n")
    result = extensions.probe_ipex(run=run, find_spec=lambda name: object(), version_of=lambda name: "2.1.100")
    assert result.installed is True and result.compatible is False
    assert result.version == "2.1.100" and result.reason and "needs to work with PyTorch" in result.reason
    assert "intel_extension_for_pytorch" in run.calls[0][-1]


def test_ipex_compatible() -> None:
    run = FakeRun(returncode=0, stdout="2.13.0+cpu\n")
    result = extensions.probe_ipex(run=run, find_spec=lambda name: object(), version_of=lambda name: "2.13.0+cpu")
    assert typed.written(result) == {"installed": True, "compatible": True, "version": "2.13.0+cpu", "reason": None}


def test_ccl_absent_costs_no_subprocess() -> None:
    run = FakeRun()
    assert extensions.probe_ccl(run=run, find_spec=lambda name: None) == (
        False, "oneccl_bindings_for_pytorch not installed")
    assert run.calls == []


def test_ccl_import_failure() -> None:
    run = FakeRun(returncode=1, stderr="ImportError: undefined symbol: _ZN3c10...\n")
    ok, reason = extensions.probe_ccl(run=run, find_spec=lambda name: object())
    assert ok is False and "undefined symbol" in reason


def test_tools_lookup() -> None:
    found = libraries.find_tools(which_from({"taskset": "/usr/bin/taskset"}))
    assert found == {"numactl": None, "taskset": "/usr/bin/taskset"}
