"""How trials are launched: from a clean distributed environment."""
from __future__ import annotations

import pytest

from autotune import launch
from autotune.config import TrialConfig
from autotune.trial import Measurement, TrialRunner

from helpers import MODELS, machine_doc

# What a Kubernetes PyTorchJob or torchrun exports into the job autotune is started from;
# MASTER_ADDR is an address of the documentation range, reachable from nowhere.
JOB = {"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "3", "MASTER_ADDR": "192.0.2.1",
       "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "job-1", "GROUP_RANK": "0"}


def test_the_rank_group_variables_are_found_and_removed_and_nothing_else():
    env = {**JOB, "PATH": "/usr/bin", "OMP_NUM_THREADS": "4", "MY_RANK_NOTE": "x"}
    assert launch.inherited_distributed(env) == sorted(JOB)
    assert launch.without_distributed(env) == {"PATH": "/usr/bin", "OMP_NUM_THREADS": "4",
                                               "MY_RANK_NOTE": "x"}


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
    assert result.setup["world"] == nprocs


def _tmp_leftovers() -> set[str]:
    import glob
    import tempfile

    root = tempfile.gettempdir()
    return {p for pattern in ("pymp-*", "torchelastic_*", "tuned-ranks-*", "autotune-trial-*")
            for p in glob.glob(f"{root}/{pattern}")}


@pytest.mark.slow
def test_a_trial_leaves_no_temporary_folders_even_from_a_long_output_path(tmp_path, monkeypatch):
    """Killed trials cannot clean up after themselves (/tmp held 195 pymp-* and
    torchelastic_* folders); and temporary folders under a long output path broke
    DataLoader workers ("AF_UNIX path too long": README command 1 lost every bf16 candidate)."""
    monkeypatch.delenv("TMPDIR", raising=False)
    before = _tmp_leftovers()
    deep = tmp_path / ("a-long-project-folder-name-" * 3) / "autotune-out" / "fashion_cnn" / "trials"
    runner = TrialRunner(model_file=MODELS / "tiny_cnn.py", machine=machine_doc(),
                         workdir=deep, measurement=Measurement(warmup_steps=2, window_s=0.2,
                                                               windows=2), timeout_s=90)
    for cfg in (TrialConfig(nprocs=2, threads=1, batch_size=16, num_workers=1,
                            persistent_workers=True),
                TrialConfig(threads=1, batch_size=16, num_workers=1, persistent_workers=True)):
        result = runner.run(cfg, name="verify-quality-candidate-1x2-512-bf16-and-more")
        assert result.status == "ok", f"{result.failure}: {result.message}\n{result.log_tail}"
    assert _tmp_leftovers() <= before, _tmp_leftovers() - before


@pytest.mark.slow
def test_compile_cache_stays_where_torch_keeps_it_for_the_user():
    """Trials and script runs get a temporary folder of their own; torch.compile's cache
    must not follow it there (every run would compile from scratch)."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    from autotune.trial import compile_cache_env

    assert compile_cache_env({}) == {"TORCHINDUCTOR_CACHE_DIR": default_cache_dir()}
    assert compile_cache_env({"TORCHINDUCTOR_CACHE_DIR": "/mine"}) == {}
