"""Utilisation: the FLOPs of a training step (counted on the model as trained, one
micro-batch of one rank), the peak FLOP/s they are a share of (a known GPU's datasheet,
else a matmul measured here), and the share in best_config.json, the summary and the
report."""
from __future__ import annotations

import json
import time

import pytest
import torch
from torch import nn

from autotune.probes import peaks
from autotune.runtime.flops import count_flops, step_flops
from autotune.runtime.session import Session

from helpers import MODELS, REPO

MACHINES = REPO / "tests" / "fixtures" / "machines"

# blocks_mlp.py: a stem Linear(16, 32), four blocks' Linear(32, 32), a head Linear(32, 4)
STEM, BLOCKS, HEAD = 16 * 32, 4 * 32 * 32, 32 * 4
# forward: 2 * in * out per Linear and sample; backward: as much again for the weights'
# gradient and again for the inputs' (not the stem's: the data needs no gradient)
BLOCKS_MLP_PER_SAMPLE = 2 * (STEM + BLOCKS + HEAD) * 2 + 2 * (BLOCKS + HEAD)


def test_the_flops_of_a_tiny_mlp_are_its_matrix_products_forward_and_backward():
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    x, y = torch.randn(5, 8, requires_grad=True), torch.randint(0, 3, (5,))
    flops = count_flops(lambda: nn.functional.cross_entropy(model(x), y))
    # an input that needs its gradient: the textbook 3 x the forward's 2 * in * out
    assert flops == 3 * 2 * (8 * 16 + 16 * 3) * 5


@pytest.mark.parametrize("knobs", [
    {},
    {"grad_accum": 2},  # one micro-batch of 8 counted: per sample the same
    {"activation_checkpointing": True},  # the blocks' recomputation is not the model's
    {"precision": "bf16"},  # FLOPs are FLOPs, whatever their precision
    {"compile": "default"},  # counted on the model inside compile's wrapper
], ids=lambda k: ",".join(k) or "plain")
def test_a_sessions_step_flops_per_sample_are_the_models_whatever_the_knobs(knobs):
    session = Session(str(MODELS / "blocks_mlp.py"), {"batch_size": 16, "threads": 1, **knobs})
    try:
        first = session.peek_batch()
        counted = step_flops(session)
        assert counted is not None
        assert counted.samples == 16 // int(knobs.get("grad_accum", 1))
        assert counted.per_sample == BLOCKS_MLP_PER_SAMPLE
        assert session.next_batch() is first, "the counted batch is still the next to train on"
        assert all(p.grad is None for p in session.model.parameters())
    finally:
        session.close()


def test_the_recorded_h100_is_the_datasheets_h100_sxm():
    name = json.loads((MACHINES / "h100x1.json").read_text())["gpus"][0]["name"]
    peak = peaks.table_peak(name, "bf16")
    assert peak is not None and peak.flop_per_s == 989e12
    assert peak.source == "table:H100 SXM bf16 dense"
    assert peaks.table_peak(name, "tf32").flop_per_s == 494.7e12
    assert peaks.table_peak("NVIDIA H100 PCIe", "bf16").flop_per_s == 756e12
    assert peaks.table_peak("NVIDIA A100-SXM4-80GB", "fp32").flop_per_s == 19.5e12
    assert peaks.table_peak("NVIDIA L40S", "bf16").flop_per_s == 362e12
    assert peaks.table_peak("NVIDIA L4", "bf16").flop_per_s == 121e12


def test_a_gpu_the_table_does_not_know_falls_back_to_the_measured_matmul():
    measured = []

    def measure(precision: str) -> peaks.Peak:
        measured.append(precision)
        return peaks.Peak(flop_per_s=1e12, source=f"measured:NVIDIA Future {precision} matmul")

    peak = peaks.device_peak(device_type="cuda", gpu_name="NVIDIA Future X1", precision="bf16", measure=measure)
    assert peak.source == "measured:NVIDIA Future bf16 matmul" and measured == ["bf16"]
    # a MIG slice has a share of the GPU's units, and V100 has no bf16: both measured
    peaks.device_peak(device_type="cuda", gpu_name="NVIDIA H100 80GB HBM3 MIG 3g.40gb", precision="fp16",
                      measure=measure)
    peaks.device_peak(device_type="cuda", gpu_name="Tesla V100-SXM2-16GB", precision="bf16", measure=measure)
    assert measured == ["bf16", "fp16", "bf16"]
    # fp32 on a GPU is fp32's peak, tf32 tf32's
    known = peaks.device_peak(device_type="cuda", gpu_name="NVIDIA H100 80GB HBM3", precision="fp32",
                              measure=measure)
    assert known.source == "table:H100 SXM fp32 dense" and len(measured) == 3


def test_a_cpu_peak_is_measured_in_the_configurations_precision_where_it_runs_natively():
    asked = []
    peaks.device_peak(device_type="cpu", gpu_name=None, precision="bf16", native_half=False,
                      measure=lambda p: asked.append(p) or peaks.Peak(flop_per_s=1.0, source=""))
    peaks.device_peak(device_type="cpu", gpu_name=None, precision="bf16", native_half=True,
                      measure=lambda p: asked.append(p) or peaks.Peak(flop_per_s=1.0, source=""))
    assert asked == ["fp32", "bf16"]
    assert peaks.cpu_native_half({"avx2", "amx_bf16"}) == {"bf16": True, "fp16": False}
    assert peaks.cpu_native_half({"avx2"}) == {"bf16": False, "fp16": False}


def test_the_measured_cpu_matmul_peak_is_short_and_names_its_threads():
    started = time.perf_counter()
    peak = peaks.measured_peak(device=torch.device("cpu"), precision="fp32")
    assert time.perf_counter() - started < 1.0
    assert peak.flop_per_s > 1e8
    assert peak.source == f"measured:cpu fp32 matmul, {torch.get_num_threads()} threads"
