"""CUDA knobs for real: run where a GPU exists, skipped elsewhere (CI has none)."""
from __future__ import annotations

import pytest
import torch

from autotune.config import TrialConfig
from autotune.trial import Measurement, TrialRunner

from helpers import MODELS

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.mark.parametrize("precision,dtype", [("fp16", "float16"), ("bf16", "bfloat16"),
                                             ("fp32", "float32")])
def test_cuda_precision_takes_effect(tmp_path, precision, dtype):
    runner = TrialRunner(model_file=MODELS / "knob_cnn.py", machine={}, workdir=tmp_path,
                         measurement=Measurement(warmup_steps=2, window_s=0.2, windows=2))
    result = runner.run(TrialConfig(device="cuda", backend="nccl", precision=precision,
                                    batch_size=32), name="t")
    assert result.status == "ok", result.log_tail
    assert dtype in result.facts["activation_dtypes"]


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_nccl_two_ranks(tmp_path):
    runner = TrialRunner(model_file=MODELS / "knob_cnn.py", machine={}, workdir=tmp_path,
                         measurement=Measurement(warmup_steps=2, window_s=0.2, windows=2))
    result = runner.run(TrialConfig(device="cuda", backend="nccl", nprocs=2, threads=2,
                                    batch_size=32), name="t")
    assert result.status == "ok", result.log_tail
    assert result.setup["world"] == 2 and result.setup["backend"] == "nccl"
