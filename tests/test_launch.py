"""How trials are launched: from a clean distributed environment."""
from __future__ import annotations

from pathlib import Path

import pytest

from autotune.config import TrialConfig
from autotune.trials import launch
from autotune.trials.runner import Measurement, TrialRunner

from helpers import MODELS, machine_doc

MACHINES = MODELS.parent / "fixtures" / "machines"

# What a Kubernetes PyTorchJob or torchrun exports into the job autotune is started from;
# MASTER_ADDR is an address of the documentation range, reachable from nowhere.
JOB = {"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "3", "MASTER_ADDR": "192.0.2.1",
       "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "job-1", "GROUP_RANK": "0"}


def test_the_rank_group_variables_are_found_and_removed_and_nothing_else():
    env = {**JOB, "PATH": "/usr/bin", "OMP_NUM_THREADS": "4", "MY_RANK_NOTE": "x"}
    assert launch.inherited_distributed(env) == sorted(JOB)
    assert launch.without_distributed(env) == {"PATH": "/usr/bin", "OMP_NUM_THREADS": "4",
                                               "MY_RANK_NOTE": "x"}


def _as_a_trial_gets_it(cfg: TrialConfig, machine: dict) -> tuple[dict[str, str], list[str]]:
    """The environment composed as TrialRunner.start composes it."""
    import os

    env_vars, warnings = launch.environment(cfg, machine=machine)
    return {**launch.without_distributed(os.environ), **env_vars}, warnings


@pytest.mark.parametrize(("variable", "value"), [("TUNED_NPROCS", "4"), ("TUNED_STORE", "/tmp/theirs"),
                                                 ("TUNED_CPUS_PER_RANK", "0,1;2,3;4,5;6,7")])
def test_autotunes_own_variables_never_leak_from_the_caller(monkeypatch, variable, value):
    """A caller's TUNED_NPROCS=4 (a trial or launch.sh started autotune) would make a
    one-process configuration start 4 ranks; for a 2-process one it was kept with a warning."""
    monkeypatch.setenv(variable, value)
    machine = machine_doc()
    one, warnings_one = _as_a_trial_gets_it(TrialConfig(threads=1, batch_size=16), machine)
    two, warnings_two = _as_a_trial_gets_it(TrialConfig(nprocs=2, threads=1, batch_size=16), machine)
    assert variable not in one and warnings_one == [] and warnings_two == []
    assert two.get(variable) != value
    if variable == "TUNED_NPROCS":
        assert two["TUNED_NPROCS"] == "2"
    assert variable not in launch.without_distributed({variable: value})


def _h100x8() -> dict:
    import json

    return json.loads((MACHINES / "h100x8.json").read_text())


def test_cuda_configurations_number_devices_in_pci_order():
    """K3: CUDA_VISIBLE_DEVICES indices and the probe's devices are NVML's (PCI) order."""
    for cfg in (TrialConfig(device="cuda", precision="bf16"),
                TrialConfig(device="cuda", nprocs=8, batch_size=64, backend="nccl")):
        env, _ = launch.environment(cfg, machine=_h100x8(), base_env={})
        assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    cpu, _ = launch.environment(TrialConfig(), machine=machine_doc(), base_env={})
    assert "CUDA_DEVICE_ORDER" not in cpu
    # the user's own choice is kept, with a warning, like any variable of theirs
    env, warnings = launch.environment(TrialConfig(device="cuda"), machine=_h100x8(),
                                       base_env={"CUDA_DEVICE_ORDER": "FASTEST_FIRST"})
    assert "CUDA_DEVICE_ORDER" not in env and "CUDA_DEVICE_ORDER" in warnings[0]


def test_compiling_ranks_share_the_cores_between_their_compile_workers():
    """S4: each rank's inductor would start a pool sized for the whole machine."""
    machine = _h100x8()  # 32 usable cores
    compiled = TrialConfig(device="cuda", nprocs=8, batch_size=64, backend="nccl", compile="default")
    env, _ = launch.environment(compiled, machine=machine, base_env={})
    assert env["TORCHINDUCTOR_COMPILE_THREADS"] == "4"
    few_cores = {**machine, "cpu": {**machine["cpu"], "usable_cores": 4}}
    env, _ = launch.environment(compiled, machine=few_cores, base_env={})
    assert env["TORCHINDUCTOR_COMPILE_THREADS"] == "1"
    for cfg in (compiled.replace(compile="off"), TrialConfig(device="cuda", compile="default"),
                TrialConfig(nprocs=2, batch_size=16, compile="default")):
        env, _ = launch.environment(cfg, machine=machine, base_env={})
        assert "TORCHINDUCTOR_COMPILE_THREADS" not in env, cfg


@pytest.mark.slow
@pytest.mark.parametrize("nprocs", [1, 2])
def test_a_trial_inside_a_users_job_starts_its_own_rank_group(tmp_path, monkeypatch, nprocs):
    for key, value in JOB.items():
        monkeypatch.setenv(key, value)
    runner = TrialRunner(model_file=MODELS / "tiny_cnn.py", machine=machine_doc(),
                         workdir=tmp_path, measurement=Measurement(warmup_steps=2, window_s=0.2,
                                                                   windows=2),
                         timeout_s=90)
    result = runner.run(TrialConfig(nprocs=nprocs, threads=1, batch_size=16), name="trial")
    assert result.status == "ok", f"{result.failure}: {result.message}\n{result.log_tail}"
    assert result.setup.world == nprocs


def _tmp_leftovers(root: Path) -> set[str]:
    import glob

    return {p for pattern in ("pymp-*", "torchelastic_*", "tuned-ranks-*", "autotune-trial-*")
            for p in glob.glob(f"{root}/{pattern}")}


@pytest.fixture
def own_tmp(monkeypatch):
    """A temporary folder (as short as /tmp's: a DataLoader worker's socket path must fit)
    that this test alone uses: other processes' trials (another test worker's, another
    run's) come and go in /tmp meanwhile."""
    import shutil
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="at-"))
    monkeypatch.setenv("TMPDIR", str(folder))
    monkeypatch.setattr(tempfile, "tempdir", str(folder))  # gettempdir() keeps what it found first
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.slow
def test_a_trial_leaves_no_temporary_folders_even_from_a_long_output_path(tmp_path, own_tmp):
    """Killed trials cannot clean up after themselves (/tmp held 195 pymp-* and
    torchelastic_* folders); and temporary folders under a long output path broke
    DataLoader workers ("AF_UNIX path too long": README command 1 lost every bf16 candidate)."""
    deep = tmp_path / ("a-long-project-folder-name-" * 3) / "autotune-out" / "fashion_cnn" / "trials"
    runner = TrialRunner(model_file=MODELS / "tiny_cnn.py", machine=machine_doc(),
                         workdir=deep, measurement=Measurement(warmup_steps=2, window_s=0.2,
                                                               windows=2), timeout_s=90)
    for cfg in (TrialConfig(nprocs=2, threads=1, batch_size=16, num_workers=1,
                            persistent_workers=True),
                TrialConfig(threads=1, batch_size=16, num_workers=1, persistent_workers=True)):
        result = runner.run(cfg, name="verify-quality-candidate-1x2-512-bf16-and-more")
        assert result.status == "ok", f"{result.failure}: {result.message}\n{result.log_tail}"
    runner.shutdown()  # the warm processes' folders go with them
    assert _tmp_leftovers(own_tmp) == set()


@pytest.mark.slow
def test_compile_cache_stays_where_torch_keeps_it_for_the_user():
    """Trials and script runs get a temporary folder of their own; torch.compile's cache
    must not follow it there (every run would compile from scratch)."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    from autotune.trials.runner import compile_cache_env

    assert compile_cache_env({}) == {"TORCHINDUCTOR_CACHE_DIR": default_cache_dir()}
    assert compile_cache_env({"TORCHINDUCTOR_CACHE_DIR": "/mine"}) == {}
