from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest

from autotune.probes import Machine, fingerprint, fingerprint_diff, fingerprint_id, probe_machine, render_text

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="module")
def docs() -> dict[str, dict]:
    return {m: probe_machine(root=str(FIXTURES / m)).to_json()
            for m in ("local_epyc_kvm", "intel_spr_2s", "amd_genoa_nps4", "arm_graviton3")}


def with_software(doc: dict) -> dict:
    doc = copy.deepcopy(doc)
    doc["torch"].update({"version": "2.13.0+cpu", "cuda": None})
    doc["allocators"] = {"jemalloc": "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2", "tcmalloc": None}
    return doc


def test_fingerprint_contents(docs: dict[str, dict]) -> None:
    fp = fingerprint(with_software(docs["intel_spr_2s"]))
    assert fp["cpu_model"] == "Intel(R) Xeon(R) Gold 6426Y"
    assert fp["usable_cores"] == 32 and fp["numa_nodes"] == 1
    assert {"amx_tile", "amx_bf16", "amx_int8", "avx512_bf16"} <= set(fp["isa"])
    assert fp["gpu_count"] == 0 and fp["gpu_names"] == []
    assert (fp["torch_version"], fp["torch_cuda"]) == ("2.13.0+cpu", None)
    assert fp["allocators"] == ["jemalloc"]
    json.dumps(fp)  # JSON-able


def test_fingerprint_id_is_stable(docs: dict[str, dict]) -> None:
    doc = with_software(docs["amd_genoa_nps4"])
    fid = fingerprint_id(doc)
    assert re.fullmatch(r"[0-9a-f]{12}", fid)
    assert fingerprint_id(copy.deepcopy(doc)) == fid
    assert fingerprint_id(fingerprint(doc)) == fid  # docs and fingerprints hash alike
    assert fingerprint_id(json.loads(json.dumps(doc))) == fid
    assert fingerprint_id(Machine.from_json(doc).to_json()) == fid
    # Volatile readings are not part of the identity.
    noisy = copy.deepcopy(doc)
    noisy["memory"]["available_bytes"] = 1
    noisy["probe_seconds"] = 99.0
    assert fingerprint_id(noisy) == fid


def test_fingerprint_id_changes_with_usable_cores(docs: dict[str, dict]) -> None:
    doc = docs["amd_genoa_nps4"]
    other = copy.deepcopy(doc)
    other["cpu"]["usable_cores"] = 8
    assert fingerprint_id(other) != fingerprint_id(doc)


def test_fingerprint_ids_differ_between_machines(docs: dict[str, dict]) -> None:
    ids = {fingerprint_id(d) for d in docs.values()}
    assert len(ids) == len(docs)


def test_fingerprint_diff_lists_the_changed_field(docs: dict[str, dict]) -> None:
    a = fingerprint(docs["amd_genoa_nps4"])
    b = dict(a, usable_cores=16)
    assert fingerprint_diff(a, b) == ["usable_cores: 4 -> 16"]
    assert fingerprint_diff(a, dict(a)) == []


def test_fingerprint_diff_sets_and_documents(docs: dict[str, dict]) -> None:
    diff = fingerprint_diff(docs["intel_spr_2s"], docs["amd_genoa_nps4"])  # whole documents accepted
    joined = "\n".join(diff)
    assert "cpu_model: Intel(R) Xeon(R) Gold 6426Y -> AMD EPYC 9354P 32-Core Processor" in diff
    assert "usable_cores: 32 -> 4" in diff
    isa_line = next(line for line in diff if line.startswith("isa:"))
    assert "lost" in isa_line and "amx_tile" in isa_line and "avx512_fp16" in isa_line
    assert "gained" not in isa_line
    assert "torch_version" not in joined  # same (unprobed) on both


def test_render_text_mentions_the_key_facts(docs: dict[str, dict]) -> None:
    text = render_text(docs["amd_genoa_nps4"])
    assert "AMD EPYC 9354P 32-Core Processor" in text
    assert "usable: 4 cores" in text and "cgroup quota 4 cores" in text
    assert "node3 24-31,56-63" in text
    assert "cgroup limit 16 GiB, usable 13 GiB" in text
    assert "avx512_bf16" in text and "amx_tile" not in text
    assert fingerprint_id(docs["amd_genoa_nps4"]) in text
    arm = render_text(docs["arm_graviton3"])
    assert "Neoverse-V1" in arm and "neon sve bf16" in arm


def test_render_text_with_gpus() -> None:
    doc = probe_machine(root=str(FIXTURES / "intel_spr_2s")).to_json()
    doc["gpus"] = [{"index": 0, "name": "NVIDIA H100 80GB HBM3", "memory_bytes": 80 << 30, "compute_capability": "9.0"}]
    doc["gpu_error"] = None
    assert "0: NVIDIA H100 80GB HBM3, 80 GiB, sm 9.0" in render_text(doc)
