"""Reduced precision end to end, for real, where this machine runs bf16 natively: a model
that bf16 breaks gets the fastest verified fp32 configuration, not the baseline, and the
summary says why bf16 was rejected. (tests/test_machine_matrix.py runs the same pipeline
on recorded probes of other machines with a stand-in runner.)"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.config import TrialConfig

from helpers import one_screen

MODELS = Path(__file__).parent / "models"


def _native_bf16() -> bool:
    from autotune.probes import probe_machine

    isa = probe_machine().to_json()["cpu"].get("isa") or {}
    return bool(isa.get("avx512_bf16") or isa.get("amx_bf16"))


@pytest.mark.slow
@pytest.mark.skipif(not _native_bf16(), reason="this CPU has no avx512_bf16 or AMX: bf16 is not searched")
def test_a_model_bf16_breaks_gets_the_best_fp32_configuration(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "autotune", "run", str(MODELS / "bf16_cancels.py"), "--trials", "4",
         "--window", "0.2", "--windows", "2", "--rounds", "2", "--pairs", "2", "--pair-seconds", "0.5",
         "--fix", "nprocs=1", "--fix", "compile=off", "--fix", "allocator=default", "--fix", "affinity=none",
         "--fix", "interop_threads=none", "--fix", "batch_size=32", "--out", str(out)],
        capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode in (0, 3), proc.stderr[-3000:]
    doc = json.loads((out / "best_config.json").read_text())
    gated = [c for c in doc["candidates"] if c["config"]["precision"] == "bf16"]
    assert gated, "no bf16 candidate reached verification: the test shows nothing"
    assert all(c["outcome"].startswith("rejected: numerics") for c in gated), gated
    assert doc["precision"]["chosen"] == "fp32" and "bf16" in doc["precision"]["rejected"]
    # the answer says it in a line; `autotune show --details`, why at length
    assert any(line.startswith("precision: bf16 rejected: ") for line in one_screen(proc.stdout, out))
    details = subprocess.run([sys.executable, "-m", "autotune", "show", str(out), "--details"],
                             capture_output=True, text=True, timeout=120, check=True).stdout
    assert "precision: bf16 rejected" in details and "diverge" in details
    if proc.returncode == 0:  # an fp32 configuration beat the baseline: it is emitted
        chosen = TrialConfig.from_dict(doc["config"])
        assert chosen.exact and chosen != TrialConfig.from_dict(doc["baseline"]["config"])
