"""train_tuned.py warns when it runs on a machine unlike the one it was tuned on."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from autotune.config import TrialConfig
from autotune.document import paths
from autotune.emit import outputs as emit

from helpers import run_document

MODEL = Path(__file__).parent / "models" / "knob_cnn.py"


def run_script(tmp_path, fingerprint):
    doc = emit.write_outputs(tmp_path / "out", cfg=TrialConfig(threads=1), model_file=MODEL,
                             env={}, document=run_document(TrialConfig(threads=1), fingerprint=fingerprint), description="t")
    return subprocess.run(["bash", paths.resolve(doc, tmp_path / "out", "launcher"), "--max-steps", "2",
                           "--no-checkpoint"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)


@pytest.mark.slow
def test_script_warns_on_a_different_machine(tmp_path):
    cores = len(os.sched_getaffinity(0))
    proc = run_script(tmp_path, {"usable_cores": cores + 14, "torch_version": "0.0.1"})
    assert proc.returncode == 0, proc.stderr
    assert f"usable_cores: tuned on {cores + 14}, here {cores}" in proc.stderr
    assert "torch_version" in proc.stderr


@pytest.mark.slow
def test_script_is_quiet_on_the_same_machine(tmp_path):
    import torch

    proc = run_script(tmp_path, {"usable_cores": len(os.sched_getaffinity(0)),
                                 "torch_version": torch.__version__})
    assert proc.returncode == 0, proc.stderr
    assert "differs from the one" not in proc.stderr
