"""CUDA paths for real: run where GPUs exist, skipped elsewhere (CI has none, and no
test here has run on a GPU yet). Beyond the knobs taking effect, the set covers what a
review of the CUDA paths found that only a GPU shows:

1. `autotune run` of the bundled examples end to end on one GPU: evaluate() gets a CUDA
   model, CUDA graphs and losses kept across steps, TF32/cuDNN flags, the scripts run alone.
2. A model that holds most of a GPU's memory: verification must not hold several
   configurations on one GPU, nor run an fp32 reference at a batch meant for eight.
3. Eight ranks: launch.sh, torchrun.sh, and ranks that each see one GPU (Slurm binding).
4. A CUDA out-of-memory error on one of two ranks is classified as out of memory.
5. The probe finds the GPUs through torch when NVML (pynvml) cannot be imported.
"""
from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from autotune.config import TrialConfig
from autotune.emit import launch
from autotune.emit import outputs as emit
from autotune.trials.runner import Measurement, TrialRunner

from helpers import MODELS, REPO, run_document

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
needs_two = pytest.mark.skipif(GPUS < 2, reason="needs two GPUs")
needs_eight = pytest.mark.skipif(GPUS < 8, reason="needs eight GPUs")

# Short windows and few pairs: these tests ask whether every stage runs, not how fast.
QUICK = ["--window", "0.3", "--windows", "2", "--rounds", "2", "--pairs", "2", "--pair-seconds", "2",
         "--trial-timeout", "240"]
# What a stage that crashed leaves in a candidate's outcome or the run's failures.
CRASH_WORDS = ("failed", "error", "Traceback", "CUDAGraphs", "same device")


def _autotune(*args: str, env: dict[str, str] | None = None, timeout: float = 1500) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "autotune", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def _run(model: Path, out: Path, *extra: str) -> tuple[int, dict]:
    proc = _autotune("run", str(model), "--out", str(out), "--json", "-q", *QUICK, *extra)
    assert proc.returncode in (0, 3), proc.stdout[-2000:] + proc.stderr[-4000:]
    doc = json.loads(proc.stdout)
    assert "error" not in doc, doc["error"]  # exit 3 with the baseline itself failing
    return proc.returncode, doc


def _no_stage_crashed(doc: dict) -> None:
    for c in doc["candidates"]:
        assert not any(word in c["outcome"] for word in CRASH_WORDS), c["outcome"]
    for f in doc["search"]["failures"]:
        # A batch too large for the GPU is found by trying it, and a long max-autotune
        # compile may run out of time; anything else is a stage that crashed.
        assert f["failure"] in ("out_of_memory", "timeout"), (f["failure"], f["message"], f["log_tail"][-2000:])


# --- the knobs take effect ----------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("precision,dtype", [("fp16", "float16"), ("bf16", "bfloat16"),
                                             ("fp32", "float32")])
def test_cuda_precision_takes_effect(tmp_path, precision, dtype):
    runner = TrialRunner(model_file=MODELS / "knob_cnn.py", machine={}, workdir=tmp_path,
                         measurement=Measurement(warmup_steps=2, window_s=0.2, windows=2))
    result = runner.run(TrialConfig(device="cuda", backend="nccl", precision=precision,
                                    batch_size=32), name="t")
    assert result.status == "ok", result.log_tail
    assert dtype in result.facts["activation_dtypes"]


@pytest.mark.slow
@needs_two
def test_nccl_two_ranks(tmp_path):
    runner = TrialRunner(model_file=MODELS / "knob_cnn.py", machine={}, workdir=tmp_path,
                         measurement=Measurement(warmup_steps=2, window_s=0.2, windows=2))
    result = runner.run(TrialConfig(device="cuda", backend="nccl", nprocs=2, threads=2,
                                    batch_size=32), name="t")
    assert result.status == "ok", result.log_tail
    assert result.setup["world"] == 2 and result.setup["backend"] == "nccl"


# --- 1. the examples end to end on one GPU ------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("name", ["fashion_cnn.py", "tiny_gpt.py"])
def test_an_example_is_tuned_end_to_end_on_one_gpu(tmp_path, name):
    if name == "tiny_gpt.py" and importlib.util.find_spec("transformers") is None:
        pytest.skip("examples/tiny_gpt.py needs transformers")
    # One GPU, whatever the node has: the examples' own verdicts, not the layouts'.
    rc, doc = _run(REPO / "examples" / name, tmp_path / "out", "--trials", "8",
                   "--fix", "device=cuda", "--fix", "nprocs=1")
    _no_stage_crashed(doc)
    assert doc["config"]["device"] == "cuda"
    if rc == 0:
        assert doc["verified"] and doc["speedup"]["median"] > 1.0
    else:  # nothing faster: explained, candidate by candidate
        assert not doc["verified"] and all(c["outcome"] for c in doc["candidates"])
    # a precision rejected for the quality check's reference (evaluate() on a CUDA model) is a crash
    for reason in doc["precision"].get("rejected", {}).values():
        assert "reference" not in reason and "failed" not in reason, reason
    assert (tmp_path / "out" / "train_tuned.py").is_file() and (tmp_path / "out" / "launch.sh").is_file()


# --- 2. a model that holds most of a GPU's memory ------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_a_model_holding_most_of_a_gpu_is_verified_without_running_out_of_memory(tmp_path):
    free, total = torch.cuda.mem_get_info()
    if free < 0.9 * total:
        pytest.skip(f"the GPU is in use: {free / 2**30:.1f} of {total / 2**30:.1f} GiB free")
    rc, doc = _run(MODELS / "fills_gpu_memory.py", tmp_path / "out", "--trials", "8",
                   "--fix", "device=cuda", "--fix", "compile=off")
    assert rc == 0 and doc["verified"], [c["outcome"] for c in doc["candidates"]]
    for c in doc["candidates"]:
        # held beside another configuration on one GPU, or an fp32 reference at a global batch
        assert "out of memory" not in c["outcome"], c["outcome"]
    for reason in doc["precision"].get("rejected", {}).values():
        assert "out of memory" not in reason, reason


# --- 3. eight ranks ---------------------------------------------------------------------------------

EIGHT = TrialConfig(device="cuda", backend="nccl", nprocs=8, threads=1, batch_size=64, pin_memory=True)


def _emit_eight(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    from autotune.probes import probe_machine

    env, _ = launch.environment(EIGHT, machine=probe_machine().to_dict())
    out = tmp_path / "out"
    emit.write_outputs(out, cfg=EIGHT, model_file=MODELS / "knob_cnn.py", env=env,
                       document=run_document(EIGHT, baseline=TrialConfig(device="cuda")), description="t")
    return out, env


def _report(work: Path) -> dict:
    return json.loads((work / "r.json").read_text())


STEPS = ["--max-steps", "20", "--no-checkpoint", "--report", "r.json"]


@pytest.mark.slow
@needs_eight
@pytest.mark.parametrize(("script", "flags"), [("launch.sh", []), ("torchrun.sh", ["--max-restarts", "0", "--"])])
def test_the_emitted_scripts_run_eight_ranks_on_eight_gpus(tmp_path, script, flags):
    out, _ = _emit_eight(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    proc = subprocess.run(["bash", str(out / script), *flags, *STEPS], cwd=work, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    facts = _report(work)["facts"]
    assert facts["world"] == 8 and facts["ddp"] is True and facts["backend"] == "nccl"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@needs_eight
def test_ranks_that_each_see_one_gpu_train(tmp_path):
    # Slurm's --gpus-per-task=1: every rank sees its GPU as cuda:0 while LOCAL_RANK goes to 7.
    out, env = _emit_eight(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    job = {k: v for k, v in env.items() if k != "TUNED_NPROCS"}
    port = str(_free_port())
    procs = []
    for rank in range(8):
        rank_env = {**os.environ, **job, "CUDA_VISIBLE_DEVICES": str(rank), "RANK": str(rank),
                    "LOCAL_RANK": str(rank), "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "8",
                    "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
        procs.append(subprocess.Popen([sys.executable, str(out / "train_tuned.py"), *STEPS], cwd=work,
                                      env=rank_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    try:
        logs = [p.communicate(timeout=600)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for rank, (p, log) in enumerate(zip(procs, logs)):
        assert p.returncode == 0, f"rank {rank}:\n{log[-3000:]}"
    facts = _report(work)["facts"]
    assert facts["world"] == 8 and facts["ddp"] is True


# --- 4. out of memory on one of two ranks ------------------------------------------------------------


@pytest.mark.slow
@needs_two
def test_cuda_out_of_memory_on_one_rank_is_classified_out_of_memory(tmp_path):
    # The other rank waits in the gradient all-reduce: the trial may end by the hang
    # limit, which must not replace what the failing rank reported.
    runner = TrialRunner(model_file=MODELS / "oom_on_one_rank.py", machine={}, workdir=tmp_path,
                         measurement=Measurement(warmup_steps=2, window_s=0.2, windows=2), hang_s=10.0)
    result = runner.run(TrialConfig(device="cuda", backend="nccl", nprocs=2, threads=2, batch_size=32), name="t")
    assert result.status != "ok"
    assert result.failure == "out_of_memory", (result.failure, result.message, result.log_tail[-3000:])


# --- 5. the probe without NVML ---------------------------------------------------------------------


@pytest.mark.slow
def test_the_probe_finds_the_gpus_through_torch_without_pynvml(tmp_path):
    # A container with only the compute driver capability has libcuda but no NVML.
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "pynvml.py").write_text("raise ImportError('pynvml is hidden for this test')\n")
    path = os.pathsep.join(filter(None, [str(shim), str(REPO), os.environ.get("PYTHONPATH")]))
    proc = _autotune("probe", "--json", env={"PYTHONPATH": path}, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    assert len(doc["gpus"]) == GPUS, doc["gpus"]
    assert "device=cuda" not in doc["space"]["excluded"], doc["space"]["excluded"]
