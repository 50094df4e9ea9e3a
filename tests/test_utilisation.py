"""Utilisation: the FLOPs of a training step (counted on the model as trained, one
micro-batch of one rank), the peak FLOP/s they are a share of (a known GPU's datasheet,
else a matmul measured here), and the share in best_config.json, the summary and the
report."""
from __future__ import annotations

import io
import json
import time

import pytest
import torch
from torch import nn

from autotune.probes import peaks
from autotune.runtime.flops import count_flops, step_flops
from autotune.runtime.session import Session

from helpers import MODELS, REPO, knob_cnn

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


def test_attention_on_cpu_counts_what_the_gpus_attention_kernels_count():
    """scaled_dot_product_attention on CPU runs a kernel FlopCounterMode had no formula for:
    a transformer's attention was left out of its FLOPs on CPU (GPT-2 small: 7.6e11 a
    sample counted on CPU, 8.9e11 on an H100)."""
    b, h, s, d = 2, 4, 128, 32
    q, k, v = (torch.randn(b, h, s, d, requires_grad=True) for _ in range(3))
    flops = count_flops(lambda: nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).sum())
    # torch's formulas for the CUDA kernels: the forward's two matrix products (4*b*h*s*s*d),
    # the backward's four and the scores recomputed (10*b*h*s*s*d)
    assert flops == 14 * b * h * s * s * d


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
        # two samples of the micro-batch counted (16 // grad_accum): the count holds what a step
        # of them holds, not a micro-batch's worth outside checkpointing and compile
        assert counted.samples == 2
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


def test_a_runs_document_carries_the_baselines_and_the_picks_share_and_the_summary_shows_it(tmp_path):
    from autotune import schemas
    from autotune.document.run import RunDocument
    from autotune.report.console import Reporter
    from autotune.report.files import report_tables

    from doubles import StandInRunner, recorded_machine, tune_stand_in

    doc = tune_stand_in(knob_cnn(), tmp_path, StandInRunner(recorded_machine("avx2_epyc")))
    assert schemas.problem(doc, "best_config") is None
    found = doc["utilisation"]
    assert found["flops_per_sample"] == 1e7 and "FlopCounterMode" in found["counted"]
    for who, rate in (("baseline", doc["baseline"]["samples_per_s"]), ("pick", doc["best"]["samples_per_s"])):
        share = found[who]
        assert share["flop_per_s"] == pytest.approx(1e7 * rate)
        assert share["share"] == pytest.approx(share["flop_per_s"] / share["peak_flop_per_s"])
        assert share["peak_source"].startswith("measured:cpu fp32 matmul, ")
    broken = {**doc, "utilisation": {**found, "pick": {**found["pick"], "peak_source": "guessed"}}}
    assert "utilisation.pick" in schemas.problem(broken, "best_config")

    read = RunDocument.from_json(doc)
    printed = io.StringIO()
    reporter = Reporter()
    reporter.out.file = printed
    reporter.details(read, tmp_path / "out")
    line = next(s for s in printed.getvalue().splitlines() if s.startswith("utilisation:"))
    assert (f"baseline {found['baseline']['share']:.1%} -> pick {found['pick']['share']:.1%} of the measured "
            "cpu fp32 matmul peak on ") in line
    table = next(t for t in report_tables(read, None) if t.title == "Utilisation")
    assert [row[0] for row in table.rows] == ["baseline", "pick"]
    assert table.rows[1][4] == f"{found['pick']['share']:.1%}"


def test_a_known_gpus_share_is_of_its_datasheet_peak_times_its_ranks(tmp_path):
    from autotune.document.utilisation import Counted, Utilisation

    peak = peaks.device_peak(device_type="cuda", gpu_name="NVIDIA H100 80GB HBM3", precision="bf16", ranks=8,
                             measure=lambda p: pytest.fail("a known GPU is not measured"))
    assert peak.flop_per_s == 8 * 989e12 and peak.source == "table:H100 SXM bf16 dense x 8 ranks"
    facts = Counted.from_json({"flops_per_sample": 6e9, **peak.to_json()})
    found = Utilisation.of(baseline_facts=facts, baseline_samples_per_s=1000.0,
                           pick_facts=facts, pick_samples_per_s=40000.0)
    assert found is not None and found.pick.share == pytest.approx(6e9 * 4e4 / (8 * 989e12))
    assert found.lines()[0] == ("utilisation: baseline 0.1% -> pick 3.0% of the datasheet's H100 SXM bf16 "
                                "dense peak on 8 ranks (6 TFLOP/s -> 240 TFLOP/s of 7.91 PFLOP/s)")


def test_an_fp32_baseline_on_a_gpu_is_also_put_against_the_dense_bf16_peak_the_field_quotes():
    """An fp32 baseline's share of its fp32 peak says how well it runs fp32, not how far it
    is from what the GPU can do: MFU is quoted against the dense bf16 peak (measured on an
    H100: GPT-2 small's fp32 baseline ran 65% of the fp32 peak, 4.4% of the bf16 one)."""
    from autotune.document.utilisation import Counted, Utilisation

    def facts(precision: str) -> Counted:
        peak = peaks.device_peak(device_type="cuda", gpu_name="NVIDIA H100 80GB HBM3", precision=precision,
                                 ranks=1, measure=lambda p: pytest.fail("a known GPU is not measured"))
        return Counted.from_json({"flops_per_sample": 8.945e11, **peak.to_json()})

    found = Utilisation.of(baseline_facts=facts("fp32"), baseline_samples_per_s=49.0,
                           pick_facts=facts("bf16"), pick_samples_per_s=388.0)
    lines = found.lines()
    assert lines[0].startswith("utilisation: baseline 65.5% -> pick 35.1% of their peaks")
    assert lines[1] == "  of the dense bf16 peak (MFU): baseline 4.4% of 989 TFLOP/s"
    alone = Utilisation.of(baseline_facts=facts("bf16"), baseline_samples_per_s=388.0,
                           pick_facts=None, pick_samples_per_s=None)
    assert not any("MFU" in line for line in alone.lines())  # its share is already the MFU
    assert peaks.mfu_peak("measured:cpu fp32 matmul, 2 threads") is None
    assert peaks.mfu_peak("table:H100 SXM fp32 dense x 8 ranks").flop_per_s == 8 * 989e12


def test_the_report_opens_with_the_utilisation(tmp_path):
    from autotune.report.files import write_report

    from doubles import StandInRunner, recorded_machine, tune_stand_in

    tune_stand_in(knob_cnn(), tmp_path, StandInRunner(recorded_machine("avx2_epyc")))
    out = tmp_path / "out"
    write_report(out)
    page = (out / "report.html").read_text()
    assert page.index("Verified speedup: ") < page.index("utilisation: baseline ") < page.index("<table")


@pytest.mark.slow
@pytest.mark.parametrize("cfg, source", [
    ({"threads": 1, "batch_size": 16, "grad_accum": 2}, r"measured:cpu fp32 matmul, 1 threads"),
    # two DDP ranks: the model counted outside DDP's wrapper (no gradient sync), and both
    # ranks' matmuls measured side by side and added up
    ({"nprocs": 2, "threads": 1, "batch_size": 32, "backend": "gloo"}, r"measured:cpu fp32 matmul, 1 threads x 2 ranks"),
], ids=["grad_accum", "ddp"])
def test_a_trial_reports_its_flops_per_sample_and_its_ranks_peak(tmp_path, cfg, source):
    import os

    from autotune.config import TrialConfig
    from autotune.trials.runner import Measurement, TrialRunner

    from helpers import machine_doc

    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 usable cores")
    runner = TrialRunner(model_file=MODELS / "blocks_mlp.py", machine=machine_doc(), workdir=tmp_path,
                         measurement=Measurement(warmup_steps=2, window_s=0.2, windows=2), timeout_s=150, hang_s=60)
    result = runner.run(TrialConfig(**cfg), name="trial")
    assert result.status == "ok", f"{result.failure}: {result.message}\n{result.log_tail}"
    found = result.facts["utilisation"]
    assert found["flops_per_sample"] == BLOCKS_MLP_PER_SAMPLE
    assert found["peak_source"] == source and found["peak_flop_per_s"] > 1e8


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.gpu
@needs_cuda
def test_on_a_gpu_a_compiled_bf16_step_counts_the_models_flops_and_its_peak_is_the_gpus():
    session = Session(str(MODELS / "blocks_mlp.py"), {"batch_size": 16, "device": "cuda", "precision": "bf16",
                                                      "compile": "default"})
    try:
        session.step()  # compiled: the count runs the model uncompiled all the same
        counted = step_flops(session)
        assert counted is not None and counted.per_sample == BLOCKS_MLP_PER_SAMPLE
    finally:
        session.close()
    name = torch.cuda.get_device_name(0)
    started = time.perf_counter()
    measured = peaks.measured_peak(device=torch.device("cuda", 0), precision="bf16")
    assert time.perf_counter() - started < 5.0
    known = peaks.table_peak(name, "bf16")
    print(f"{name}: table {known}, measured {measured}")
    assert measured.source == f"measured:{name} bf16 matmul"
    if known is not None:
        # a bf16 matmul reaches most of the datasheet's dense peak, never more
        assert 0.3 * known.flop_per_s < measured.flop_per_s < 1.05 * known.flop_per_s


def test_a_peak_that_could_not_be_measured_leaves_the_share_out_not_the_trial(monkeypatch):
    from autotune.document.utilisation import Counted, Share
    from autotune.trials import step_facts

    def fails(**kw):
        raise RuntimeError("out of memory")

    monkeypatch.setattr(step_facts, "_PEAKS", {})
    monkeypatch.setattr(peaks, "measured_peak", fails)
    session = Session(str(MODELS / "blocks_mlp.py"), {"batch_size": 16, "threads": 1})
    try:
        facts = step_facts.utilisation_facts(session, settle=lambda: None)
    finally:
        session.close()
    assert facts["flops_per_sample"] == BLOCKS_MLP_PER_SAMPLE and facts["peak_flop_per_s"] == 0.0
    assert Share.of(Counted.from_json(facts), samples_per_s=100.0) is None


def test_a_pick_no_trial_ran_takes_the_models_flops_and_the_peak_of_a_trial_on_its_ranks_and_threads():
    """The README example emitted 2 ranks x 1 thread at batch 1024, a layout verification made
    from the search's 1 x 2 winner: no trial ran it, and its summary gave the baseline's share
    alone. The model's FLOPs per sample are any trial's; the peak is that of a trial on the same
    ranks, threads and precision (a pruned trial's first step measured it)."""
    from autotune.config import TrialConfig
    from autotune.document.utilisation import Counted, pick_facts
    from autotune.verify.reference import work_key

    def result(source: str, peak: float) -> dict:  # a trial's first-step facts
        return {"utilisation": {"flops_per_sample": 2.5e7, "peak_flop_per_s": peak, "peak_source": source}}

    one = "measured:cpu fp32 matmul, 2 threads"
    two = "measured:cpu fp32 matmul, 1 threads x 2 ranks"
    trials = [(TrialConfig(batch_size=1024, threads=2, allocator="tcmalloc"), result(one, 1.4e11)),
              (TrialConfig(nprocs=2, threads=1, batch_size=16, allocator="jemalloc"), result(two, 1.3e11))]
    chosen = TrialConfig(nprocs=2, threads=1, batch_size=1024, allocator="tcmalloc")
    facts = pick_facts(chosen, trials, work_key=work_key)
    assert facts == Counted(flops_per_sample=2.5e7, peak_flop_per_s=1.3e11, peak_source=two)
    # a pruned pick computes less: the unpruned model's count is not its count
    assert pick_facts(chosen.replace(prune_ratio=0.25), trials, work_key=work_key) is None
    # nor is another thread count's peak its peak
    assert pick_facts(chosen.replace(threads=2), trials, work_key=work_key) is None
