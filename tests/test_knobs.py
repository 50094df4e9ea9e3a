"""Every knob takes effect inside the trial process, and the generated script
reproduces it: both are read the same way (autotune.runtime.facts: process_facts, step_facts)."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from autotune.config import TrialConfig
from autotune.document import paths
from autotune.emit import outputs as emit
from autotune.probes import probe_machine
from autotune.trials import launch
from autotune.trials.runner import Measurement, TrialRunner

# One xdist worker runs this module: its module fixture runs once (README: pytest -n 2).
pytestmark = pytest.mark.xdist_group("knobs")

MODEL = Path(__file__).parent / "models" / "knob_cnn.py"


@pytest.fixture(scope="module")
def machine():
    return probe_machine().to_json()


def needs_allocator(machine, name):
    if not (machine.get("allocators") or {}).get(name):
        pytest.skip(f"{name} is not installed (CI installs it: see .ci/run)")


def widths_halved(f):
    w = f["layer_widths"]
    return w["0"] == 8 and w["2"] == 16 and w["6"] == 16 and w["8"] == 4  # head kept at 4


# Each knob's check, on the facts the trial and the script report. Knobs that do not
# interfere share a configuration, measured once per module (KNOBS below): every check
# still fails on its own when its knob stops taking effect, and each knob is seen at two
# values (threads 1 and 2, bf16 and fp32, channels_last on and off).
CHECKS = {
    "threads=1": lambda f: f["threads"] == 1,
    "threads=2": lambda f: f["threads"] == 2,
    "interop_threads=1": lambda f: f["interop_threads"] == 1,
    "nprocs=2 gloo": lambda f: f["world"] == 2 and f["backend"] == "gloo" and f["ddp"] and f["per_rank_batch"] == 8,
    "affinity=compact": lambda f: f["affinity"] == [0] and f["env"]["OMP_PROC_BIND"] == "close",
    "allocator=jemalloc": lambda f: any("jemalloc" in lib for lib in f["libraries"]),
    "allocator=tcmalloc": lambda f: any("tcmalloc" in lib for lib in f["libraries"]),
    "precision=bf16": lambda f: "bfloat16" in f["activation_dtypes"],
    "precision=fp32": lambda f: f["activation_dtypes"] == ["float32"],
    "channels_last": lambda f: f["conv_inputs_channels_last"] == [True],
    "channels_last off": lambda f: f["conv_inputs_channels_last"] == [False],
    "prune_ratio=0.5": widths_halved,
    "compile": lambda f: f["compiled"] is True,
    "optimizer_step=fused": lambda f: f["optimizer"]["class"] == "AdamW" and f["optimizer"]["fused"] is True,
    "optimizer_step=default": lambda f: f["optimizer"]["fused"] is None and f["optimizer"]["foreach"] is None,
    "prefetch_factor=4": lambda f: f["loader_prefetch_factor"] == 4,
}

# (configuration, the allocator it adds where installed, the knobs it shows)
KNOBS = {
    "one thread": (TrialConfig(threads=1, interop_threads=1, precision="bf16", channels_last=True, prune_ratio=0.5),
                   "jemalloc", ["threads=1", "interop_threads=1", "precision=bf16", "channels_last",
                                "prune_ratio=0.5", "allocator=jemalloc", "optimizer_step=default"]),
    "two threads": (TrialConfig(threads=2, optimizer_step="fused", num_workers=1, prefetch_factor=4), "tcmalloc",
                    ["threads=2", "precision=fp32", "channels_last off", "allocator=tcmalloc",
                     "optimizer_step=fused", "prefetch_factor=4"]),
    "two ranks": (TrialConfig(nprocs=2, threads=1, affinity="compact"), None, ["nprocs=2 gloo", "affinity=compact"]),
    "compiled": (TrialConfig(compile="default"), None, ["compile"]),
}
SHOWN_BY = {name: group for group, (_, _, names) in KNOBS.items() for name in names}
ALLOCATOR_OF = {f"allocator={allocator}": allocator for _, allocator, _ in KNOBS.values() if allocator}


@pytest.fixture(scope="module")
def facts(machine, tmp_path_factory):
    """facts(group) -> (the trial's facts, the generated script's facts), each group run once."""
    done: dict[str, tuple[dict, dict]] = {}

    def run(group: str) -> tuple[dict, dict]:
        if group not in done:
            done[group] = _trial_and_script(group, machine, tmp_path_factory.mktemp(group.replace(" ", "-")))
        return done[group]

    return run


def _trial_and_script(group: str, machine: dict, tmp_path: Path) -> tuple[dict, dict]:
    cfg, allocator, _ = KNOBS[group]
    cfg = cfg.replace(batch_size=16)
    if allocator and (machine.get("allocators") or {}).get(allocator):
        cfg = cfg.replace(allocator=allocator)
    runner = TrialRunner(model_file=MODEL, machine=machine, workdir=tmp_path / "trials",
                         measurement=Measurement(warmup_steps=2, window_s=0.2, windows=1),
                         timeout_s=240)
    result = runner.run(cfg, name="t")
    assert result.status == "ok", result.log_tail

    env, _ = launch.environment(cfg, machine=machine, base_env={})
    doc = emit.write_candidate(tmp_path / "out", cfg=cfg, model_file=MODEL, env=env, description=group)
    report = tmp_path / "report.json"
    proc = subprocess.run(["bash", paths.resolve(doc, tmp_path / "out", "launcher"), "--max-steps", "4", "--no-checkpoint",
                           "--report", str(report)], capture_output=True, text=True, timeout=240,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return {**result.setup.to_json(), **result.facts}, json.loads(report.read_text())["facts"]


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CHECKS))
def test_knob_takes_effect_in_trial_and_in_generated_script(name, machine, facts):
    if name in ALLOCATOR_OF:
        needs_allocator(machine, ALLOCATOR_OF[name])
    trial_facts, script_facts = facts(SHOWN_BY[name])
    check = CHECKS[name]
    assert check(trial_facts), f"{name} did not take effect in the trial: {trial_facts}"
    assert check(script_facts), f"{name} was not reproduced by train_tuned.py: {script_facts}"


def test_every_knob_is_shown_by_one_configuration():
    assert sorted(SHOWN_BY) == sorted(CHECKS)
