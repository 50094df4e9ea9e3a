"""Every knob takes effect inside the trial process, and the generated script
reproduces it: both are read the same way (autotune.runtime.facts: process_facts, step_facts)."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from autotune.config import TrialConfig
from autotune.emit import launch
from autotune.emit import outputs as emit
from autotune.probes import probe_machine
from autotune.trials.runner import Measurement, TrialRunner

MODEL = Path(__file__).parent / "models" / "knob_cnn.py"


@pytest.fixture(scope="module")
def machine():
    return probe_machine().to_dict()


def needs_allocator(machine, name):
    if not (machine.get("allocators") or {}).get(name):
        pytest.skip(f"{name} is not installed (CI installs it: see .ci/run)")


def widths_halved(f):
    w = f["layer_widths"]
    return w["0"] == 8 and w["2"] == 16 and w["6"] == 16 and w["8"] == 4  # head kept at 4


# (config, check on facts, allocator needed)
CASES = {
    "threads=1": (TrialConfig(threads=1), lambda f: f["threads"] == 1, None),
    "threads=2": (TrialConfig(threads=2), lambda f: f["threads"] == 2, None),
    "interop_threads=1": (TrialConfig(interop_threads=1), lambda f: f["interop_threads"] == 1, None),
    "nprocs=2 gloo": (TrialConfig(nprocs=2, threads=1),
                      lambda f: f["world"] == 2 and f["backend"] == "gloo" and f["ddp"]
                      and f["per_rank_batch"] == 8, None),
    "affinity=compact": (TrialConfig(nprocs=2, threads=1, affinity="compact"),
                         lambda f: f["affinity"] == [0] and f["env"]["OMP_PROC_BIND"] == "close", None),
    "allocator=jemalloc": (TrialConfig(allocator="jemalloc"),
                           lambda f: any("jemalloc" in lib for lib in f["libraries"]), "jemalloc"),
    "allocator=tcmalloc": (TrialConfig(allocator="tcmalloc"),
                           lambda f: any("tcmalloc" in lib for lib in f["libraries"]), "tcmalloc"),
    "precision=bf16": (TrialConfig(precision="bf16"),
                       lambda f: "bfloat16" in f["activation_dtypes"], None),
    "precision=fp32": (TrialConfig(), lambda f: f["activation_dtypes"] == ["float32"], None),
    "channels_last": (TrialConfig(channels_last=True),
                      lambda f: f["conv_inputs_channels_last"] == [True], None),
    "channels_last off": (TrialConfig(), lambda f: f["conv_inputs_channels_last"] == [False], None),
    "prune_ratio=0.5": (TrialConfig(prune_ratio=0.5), widths_halved, None),
    "compile": (TrialConfig(compile="default"), lambda f: f["compiled"] is True, None),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
def test_knob_takes_effect_in_trial_and_in_generated_script(name, machine, tmp_path):
    cfg, check, allocator = CASES[name]
    cfg = cfg.replace(batch_size=16)
    if allocator:
        needs_allocator(machine, allocator)
    runner = TrialRunner(model_file=MODEL, machine=machine, workdir=tmp_path / "trials",
                         measurement=Measurement(warmup_steps=2, window_s=0.2, windows=1),
                         timeout_s=240)
    result = runner.run(cfg, name="t")
    assert result.status == "ok", result.log_tail
    trial_facts = {**result.setup, **result.facts}
    assert check(trial_facts), f"{name} did not take effect in the trial: {trial_facts}"

    env, _ = launch.environment(cfg, machine=machine, base_env={})
    doc = emit.write_candidate(tmp_path / "out", cfg=cfg, model_file=MODEL, env=env, description=name)
    report = tmp_path / "report.json"
    proc = subprocess.run(["bash", emit.resolve(doc, tmp_path / "out", "launcher"), "--max-steps", "4", "--no-checkpoint",
                           "--report", str(report)], capture_output=True, text=True, timeout=240,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    script_facts = json.loads(report.read_text())["facts"]
    assert check(script_facts), f"{name} was not reproduced by train_tuned.py: {script_facts}"
