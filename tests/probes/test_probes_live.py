"""probe_machine() on the machine running the tests (one probe, shared)."""
from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import platform
import sys
import time

import pytest

from autotune.probes import Machine, fingerprint_id, libraries, probe_machine, render_text

HAS_TORCH = importlib.util.find_spec("torch") is not None


@pytest.fixture(scope="module")
def live() -> tuple[Machine, float]:
    start = time.perf_counter()
    probe = probe_machine()
    return probe, time.perf_counter() - start


@pytest.mark.slow
def test_document_is_json_and_round_trips(live: tuple[Machine, float]) -> None:
    doc = live[0].to_json()
    assert json.loads(json.dumps(doc)) == doc
    assert Machine.from_json(doc).to_json() == doc
    for key in ("cpu", "memory", "gpus", "gpu_error", "driver", "torch", "backends", "backend_errors",
                "compile", "allocators", "openmp", "ipex", "tools"):
        assert key in doc, key
    assert set(doc["backends"]) == {"gloo", "nccl", "mpi", "ccl"}
    assert render_text(doc).count("\n") > 10
    assert len(fingerprint_id(doc)) == 12


def test_usable_cores_match_affinity(live: tuple[Machine, float]) -> None:
    cpu = live[0].cpu
    affinity = sorted(os.sched_getaffinity(0))
    assert cpu.usable_cpus == affinity
    expected = len(affinity)
    if cpu.cgroup_cpu_limit is not None:
        expected = min(expected, -(-int(cpu.cgroup_cpu_limit * 1000) // 1000))
    assert cpu.usable_cores == expected
    assert cpu.logical_cores >= len(affinity)
    assert cpu.physical_cores <= cpu.logical_cores


def test_memory_is_sane(live: tuple[Machine, float]) -> None:
    mem = live[0].memory
    assert mem.total_bytes and mem.available_bytes and mem.usable_bytes
    assert 0 < mem.usable_bytes <= mem.available_bytes <= mem.total_bytes


@pytest.mark.skipif(not HAS_TORCH, reason="torch not installed")
def test_torch_and_gloo(live: tuple[Machine, float]) -> None:
    probe = live[0]
    # the release, without the build's local part: a CUDA wheel may report 2.11.0+cu130 at
    # run time while its package metadata says 2.11.0 (the GPU machine's torch does)
    assert (probe.torch.version or "").split("+")[0] == importlib.metadata.version("torch").split("+")[0]
    assert probe.backends["gloo"] is True, probe.backend_errors.get("gloo")
    if not probe.torch.cuda_available:
        assert probe.backends["nccl"] is False and probe.backend_errors["nccl"]


def test_allocators_match_disk(live: tuple[Machine, float]) -> None:
    probe = live[0]
    ldconfig = libraries.read_ldconfig()
    tag = libraries.ldconfig_arch_tag(platform.machine())
    before, after = libraries.library_search_dirs(env=os.environ, prefix=sys.prefix, machine=platform.machine())
    for name, names in libraries.ALLOCATOR_NAMES.items():
        path = probe.allocators[name]
        on_disk = [os.path.join(d, n) for d in before + after for n in names if os.path.isfile(os.path.join(d, n))]
        in_cache = [e.path for e in ldconfig if e.name in names and (tag is None or tag in e.tags) and os.path.isfile(e.path)]
        if path is None:
            assert not on_disk and not in_cache, name
        else:
            assert os.path.isfile(path) and os.path.basename(path) in names
            assert path in on_disk + in_cache


def test_compile_and_tools_consistent(live: tuple[Machine, float]) -> None:
    probe = live[0]
    comp = probe.compile
    if comp.available:
        assert comp.compiler and os.path.exists(comp.compiler) and comp.reason is None
    else:
        assert comp.reason
    for tool, path in probe.tools.items():
        assert path is None or os.access(path, os.X_OK), tool
    assert probe.ipex.installed == (importlib.util.find_spec("intel_extension_for_pytorch") is not None)


def test_gpu_section_is_clean(live: tuple[Machine, float]) -> None:
    probe = live[0]
    if not probe.gpus:
        assert probe.gpu_error  # always a reason when there are no GPUs
    else:
        assert probe.gpu_error is None


def test_probe_is_fast(live: tuple[Machine, float]) -> None:
    probe, elapsed = live
    print(f"\nprobe_machine() took {elapsed:.2f} s; timings {probe.timings}")
    # Target is < 5 s on 2 cores; leave headroom for a loaded CI box.
    assert elapsed < 15
