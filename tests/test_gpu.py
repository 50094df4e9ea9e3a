"""CUDA paths for real: run where GPUs exist, skipped elsewhere (CI has none). Beyond the
knobs taking effect, the set covers what a review of the CUDA paths found that only a GPU
shows. The tests run in file order, cheapest first, each on its own (none reads what an
earlier one left); on one H100 the whole file should take about 5 minutes
(bench/gpu_check.sh runs it with the README example, its independent check and
examples/tiny_gpt.py):

1. A real CUDA out-of-memory error (an allocation larger than the GPU) is classified as out
   of memory; so is one raised on one of two ranks.
2. The probe finds the GPUs through torch when NVML (pynvml) cannot be imported.
3. train_tuned.py on a GPU across epoch ends: evaluate() after each epoch gets the CUDA model.
4. reduce-overhead (CUDA graphs) on a model that computes its own loss inside the compiled
   graph: the losses of successive steps are kept, finite and falling.
5. Eight ranks: launch.sh, torchrun.sh, and ranks that each see one GPU (Slurm binding).
6. A model that holds most of a GPU's memory: verification must not hold several
   configurations on one GPU, nor run an fp32 reference at a batch meant for eight.
7. `autotune run` of the bundled examples end to end on one GPU, shortened by --timeout and
   without torch.compile (4 tests above it cover CUDA graphs; bench/gpu_check.sh runs the
   README example whole): evaluate() gets a CUDA model, TF32/cuDNN flags, the scripts run alone.
"""
from __future__ import annotations

import importlib.util
import json
import math
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from autotune.config import TrialConfig
from autotune.emit import outputs as emit
from autotune.trials import launch
from autotune.trials.runner import Measurement, TrialRunner

from helpers import MODELS, REPO, run_document, run_launch_sh

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
needs_two = pytest.mark.skipif(GPUS < 2, reason="needs two GPUs")
needs_eight = pytest.mark.skipif(GPUS < 8, reason="needs eight GPUs")

# Short windows and few pairs: these tests ask whether every stage runs, not how fast.
QUICK = ["--window", "0.3", "--windows", "2", "--rounds", "2", "--pairs", "2", "--pair-seconds", "2",
         "--trial-timeout", "90"]
# An end-to-end run's whole budget (--timeout: the search gets half of it, verification is
# fitted to the rest), and how long its process may take beyond it before the test fails.
RUN_TIMEOUT_S = 50
RUN_OVERRUN_S = 100
# What a stage that crashed leaves in a candidate's outcome or the run's failures.
CRASH_WORDS = ("failed", "error", "Traceback", "CUDAGraphs", "same device")


def _autotune(*args: str, env: dict[str, str] | None = None, timeout: float = 1500) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "autotune", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def _run(model: Path, out: Path, *extra: str) -> tuple[int, dict]:
    proc = _autotune("run", str(model), "--out", str(out), "--json", "-q", *QUICK,
                     "--timeout", str(RUN_TIMEOUT_S), *extra, timeout=RUN_TIMEOUT_S + RUN_OVERRUN_S)
    assert proc.returncode in (0, 3), proc.stdout[-2000:] + proc.stderr[-4000:]
    doc = json.loads(proc.stdout)
    assert "error" not in doc, doc["error"]  # exit 3 with the baseline itself failing
    return proc.returncode, doc


def _no_stage_crashed(doc: dict) -> None:
    for c in doc["candidates"]:
        assert not any(word in c["outcome"] for word in CRASH_WORDS), c["outcome"]
    for f in doc["search"]["failures"]:
        # A batch too large for the GPU is found by trying it; anything else (a trial past
        # --trial-timeout included: a hung compile) is a stage that crashed.
        assert f["failure"] == "out_of_memory", (f["failure"], f["message"], f["log_tail"][-2000:])


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


# --- 1. out of memory ------------------------------------------------------------------------------


def _runner(tmp_path: Path, model: str, **kwargs) -> TrialRunner:
    return TrialRunner(model_file=MODELS / model, machine={}, workdir=tmp_path,
                       measurement=Measurement(warmup_steps=2, window_s=0.2, windows=2), **kwargs)


@pytest.mark.slow
def test_a_real_cuda_out_of_memory_is_classified_out_of_memory(tmp_path):
    # The step asks for twice the GPU's memory: the caching allocator's own error, not a stand-in.
    result = _runner(tmp_path, "cuda_oom.py", timeout_s=120).run(
        TrialConfig(device="cuda", backend="nccl", batch_size=32), name="t")
    assert result.status == "failed"
    assert result.failure == "out_of_memory", (result.failure, result.message, result.log_tail[-3000:])


@pytest.mark.slow
@needs_two
def test_cuda_out_of_memory_on_one_rank_is_classified_out_of_memory(tmp_path):
    # The other rank waits in the gradient all-reduce: the trial may end by the hang
    # limit, which must not replace what the failing rank reported.
    runner = _runner(tmp_path, "oom_on_one_rank.py", hang_s=10.0)
    result = runner.run(TrialConfig(device="cuda", backend="nccl", nprocs=2, threads=2, batch_size=32), name="t")
    assert result.status != "ok"
    assert result.failure == "out_of_memory", (result.failure, result.message, result.log_tail[-3000:])


# --- 2. the probe without NVML ---------------------------------------------------------------------


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
    # "gpus" is NVML's list, empty here; the GPUs are torch's, and they are tuned on
    assert doc["gpus"] == [], doc["gpus"]
    assert len(doc["torch"]["cuda_devices"]) == GPUS, doc["torch"]["cuda_devices"]
    assert any("NVML found no GPUs but torch sees" in w for w in doc["warnings"]), doc["warnings"]
    assert "device=cuda" not in doc["space"]["excluded"], doc["space"]["excluded"]


def _report(work: Path) -> dict:
    return json.loads((work / "r.json").read_text())


# --- 3. train_tuned.py across epoch ends ------------------------------------------------------------

TINY_ITEMS, TINY_BATCH = 512, 64  # tests/models/tiny_cnn.py: 8 steps an epoch


@pytest.mark.slow
def test_train_tuned_evaluates_after_each_epoch_on_cuda(tmp_path, no_autotune_env):
    from autotune.probes import probe_machine

    cfg = TrialConfig(device="cuda", backend="nccl", batch_size=TINY_BATCH, num_workers=1, pin_memory=True)
    env, _ = launch.environment(cfg, machine=probe_machine().to_json())
    out, work = tmp_path / "out", tmp_path / "work"
    emit.write_candidate(out, cfg=cfg, model_file=MODELS / "tiny_cnn.py", env=env, description="t")
    proc = run_launch_sh(out, work, no_autotune_env, "--epochs", "2", "--log-every", "1", "--report", "r.json",
                         timeout=240)
    assert "epoch 1  evaluate" in proc.stdout and "epoch 2  evaluate" in proc.stdout, proc.stdout[-3000:]
    lines = [json.loads(line) for line in (work / "checkpoints" / "metrics.jsonl").read_text().splitlines()]
    evaluated = [line for line in lines if "evaluate" in line]
    per_epoch = TINY_ITEMS // TINY_BATCH
    assert [line["step"] for line in evaluated] == [per_epoch, 2 * per_epoch], lines
    assert all(0 <= line["evaluate"] <= 1 for line in evaluated), evaluated
    report = _report(work)
    assert report["steps"] == 2 * per_epoch, report
    assert all(math.isfinite(loss) for loss in report["losses"]), report["losses"]


# --- 4. CUDA graphs on a model that computes its loss ------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_reduce_overhead_trains_a_model_that_computes_its_own_loss(tmp_path):
    # forward(inputs, targets) returns the loss: under reduce-overhead it is a CUDA graph's
    # output, which the next replay overwrites unless the trainer kept it.
    steps = 30
    result = _runner(tmp_path, "loss_in_model.py", timeout_s=360).run(
        TrialConfig(device="cuda", backend="nccl", compile="reduce-overhead", batch_size=32), name="t",
        trajectory_steps=steps)
    assert result.status == "ok", (result.failure, result.message, result.log_tail[-3000:])
    losses = result.losses
    assert len(losses) == steps and all(math.isfinite(loss) for loss in losses), losses
    assert len(set(losses)) > steps // 2, losses  # overwritten outputs would repeat one value
    assert sum(losses[-5:]) / 5 < 0.7 * sum(losses[:5]) / 5, losses


@pytest.mark.slow
@needs_two
def test_nccl_two_ranks(tmp_path):
    runner = TrialRunner(model_file=MODELS / "knob_cnn.py", machine={}, workdir=tmp_path,
                         measurement=Measurement(warmup_steps=2, window_s=0.2, windows=2))
    result = runner.run(TrialConfig(device="cuda", backend="nccl", nprocs=2, threads=2,
                                    batch_size=32), name="t")
    assert result.status == "ok", result.log_tail
    assert result.setup.world == 2 and result.setup.backend == "nccl"


# --- 5. eight ranks ---------------------------------------------------------------------------------

EIGHT = TrialConfig(device="cuda", backend="nccl", nprocs=8, threads=1, batch_size=64, pin_memory=True)


def _emit_eight(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    from autotune.probes import probe_machine

    env, _ = launch.environment(EIGHT, machine=probe_machine().to_json())
    out = tmp_path / "out"
    emit.write_outputs(out, cfg=EIGHT, model_file=MODELS / "knob_cnn.py", env=env,
                       document=run_document(EIGHT, baseline=TrialConfig(device="cuda")), description="t")
    return out, env


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


# --- 6. a model that holds most of a GPU's memory ------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT_S + RUN_OVERRUN_S + 30)
def test_a_model_holding_most_of_a_gpu_is_verified_without_running_out_of_memory(tmp_path):
    free, total = torch.cuda.mem_get_info()
    if free < 0.9 * total:
        pytest.skip(f"the GPU is in use: {free / 2**30:.1f} of {total / 2**30:.1f} GiB free")
    rc, doc = _run(MODELS / "fills_gpu_memory.py", tmp_path / "out", "--trials", "4",
                   "--fix", "device=cuda", "--fix", "compile=off")
    # --timeout may end verification before a verdict (exit 3): what it held must still fit
    assert rc == 0 or all(c["outcome"] for c in doc["candidates"]), doc["candidates"]
    for c in doc["candidates"]:
        # held beside another configuration on one GPU, or an fp32 reference at a global batch
        assert "out of memory" not in c["outcome"], c["outcome"]
    for reason in doc["precision"].get("rejected", {}).values():
        assert "out of memory" not in reason, reason


# --- 7. the examples end to end on one GPU ------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT_S + RUN_OVERRUN_S + 30)
@pytest.mark.parametrize("name", ["fashion_cnn.py", "tiny_gpt.py"])
def test_an_example_is_tuned_end_to_end_on_one_gpu(tmp_path, name):
    if name == "tiny_gpt.py" and importlib.util.find_spec("transformers") is None:
        pytest.skip("examples/tiny_gpt.py needs transformers")
    # One GPU, whatever the node has: the examples' own verdicts, not the layouts'. Not
    # compiled: a compiled trial alone can take 100 s on an H100 (BENCHMARKS.md); the tests
    # above run CUDA graphs, and bench/gpu_check.sh the README example with all its knobs.
    rc, doc = _run(REPO / "examples" / name, tmp_path / "out", "--trials", "4",
                   "--fix", "device=cuda", "--fix", "nprocs=1", "--fix", "compile=off")
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
