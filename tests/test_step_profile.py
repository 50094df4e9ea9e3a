"""Where the pick's step goes: the categoriser over recorded profiler events (CPU) and a
synthetic GPU timeline with gaps, the emitted script's --profile on a real model, and the
profile in best_config.json, the report and the advice."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from autotune import schemas
from autotune.config import TrialConfig
from autotune.options import RunOptions
from autotune.report import advice
from autotune.report.files import report_tables
from autotune.report.profile import advice_lines
from autotune.runtime.shares import (
    DATA_WAIT,
    STEP,
    WINDOW,
    Category,
    ProfilerEvent,
    ProfilerEventKind,
    category_of,
    step_shares,
)
from autotune.runtime.step_profile import StepProfile

from helpers import MODELS, emit_outputs, run_launch_sh
from recorded_run import load_doc

FIXTURES = Path(__file__).parent / "fixtures" / "profiles"


def recorded(name: str) -> list[ProfilerEvent]:
    data = json.loads((FIXTURES / name).read_text())
    return [ProfilerEvent(name=n, start=s, duration=d, kind=ProfilerEventKind(k), thread=t) for n, s, d, k, t in data["events"]]


@pytest.mark.parametrize(("name", "category"), [
    ("aten::scaled_dot_product_attention", Category.ATTENTION),
    ("autograd::engine::evaluate_function: ScaledDotProductFlashAttentionForCpuBackward0", Category.ATTENTION),
    ("fmha_cutlassF_f32_aligned_64x64_rf_sm80", Category.ATTENTION),  # a cutlass kernel, but attention's
    ("void flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4>>", Category.ATTENTION),
    ("aten::linear", Category.MATMUL),
    ("autograd::engine::evaluate_function: ConvolutionBackward0", Category.CONVOLUTION),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", Category.MATMUL),
    ("Optimizer.step#AdamW.step", Category.OPTIMIZER),
    ("Optimizer.zero_grad#SGD.zero_grad", Category.OPTIMIZER),
    ("void at::native::multi_tensor_apply_kernel<TensorListMetadata<4>>", Category.OPTIMIZER),
    (DATA_WAIT, Category.DATA_WAIT),
    ("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", Category.COMMUNICATION),
    ("c10d::allreduce_", Category.COMMUNICATION),
    ("gloo:all_reduce", Category.COMMUNICATION),
    ("aten::relu", None),
    ("Torch-Compiled Region: 0/0", None),
])
def test_an_event_is_categorised_by_its_name(name, category):
    assert category_of(name) == category


def test_recorded_cpu_events_divide_the_window_once_with_sdpa_in_attention():
    """Two steps of linear + scaled_dot_product_attention with SGD, each after a 2 ms data
    wait, as torch.profiler recorded them: nested ops (aten::linear holds aten::addmm) are
    counted once, so the shares add up to the window."""
    events = recorded("cpu_sdpa.json")
    shares = step_shares(events)
    assert shares.steps == 2 and shares.source == "cpu ops"
    assert sum(shares.shares.values()) == pytest.approx(1.0, abs=1e-6)
    assert sum(shares.ms.values()) == pytest.approx(shares.window_ms, rel=1e-6)

    def total_ms(name: str) -> float:
        return sum(e.duration for e in events if e.name == name) / 1000.0

    # the sdpa ops, forward and backward, all in attention; the optimizer's ranges in optimizer
    assert shares.ms[Category.ATTENTION] == pytest.approx(
        total_ms("aten::scaled_dot_product_attention")
        + total_ms("autograd::engine::evaluate_function: ScaledDotProductFlashAttentionForCpuBackward0"))
    assert shares.ms[Category.OPTIMIZER] == pytest.approx(
        total_ms("Optimizer.step#SGD.step") + total_ms("Optimizer.zero_grad#SGD.zero_grad"))
    assert shares.ms[Category.DATA_WAIT] == pytest.approx(total_ms(DATA_WAIT)) and total_ms(DATA_WAIT) >= 4.0
    assert shares.ms[Category.MATMUL] >= total_ms("aten::linear") > 0
    assert shares.ms[Category.COMMUNICATION] == 0.0


@pytest.mark.parametrize(("name", "category"), [
    # the host's ops, as torch names them on CPU and CUDA
    ("aten::conv2d", Category.CONVOLUTION),
    ("aten::mkldnn_convolution", Category.CONVOLUTION),
    ("aten::cudnn_convolution", Category.CONVOLUTION),
    ("aten::convolution_backward", Category.CONVOLUTION),
    ("mkldnn::_convolution_pointwise", Category.CONVOLUTION),  # a compiled region's conv on CPU
    # cuDNN's and PyTorch's convolution kernels
    ("void cudnn::detail::implicit_convolve_sgemm<float, float, 128, 5, 5, 3, 3, 3, 1, false, false, true>",
     Category.CONVOLUTION),
    ("void cudnn::winograd_nonfused::winogradForwardData4x4<float, float>", Category.CONVOLUTION),
    ("void cudnn::detail::dgrad_engine<float, 128, 6, 7, 3, 3, 5, false>", Category.CONVOLUTION),
    ("void cudnn::detail::wgrad_alg0_engine<float, 128, 6, 8, 3, 3, 5, false, 512>", Category.CONVOLUTION),
    ("sm80_xmma_fprop_implicit_gemm_tf32f32_tf32f32_f32_nhwckrsc_nhwc_tilesize128x128x16_stage4", Category.CONVOLUTION),
    ("sm90_xmma_dgrad_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nchw", Category.CONVOLUTION),
    ("sm80_xmma_wgrad_implicit_gemm_indexed_tf32f32_tf32f32_f32_nhwckrsc_nchw", Category.CONVOLUTION),
    ("ampere_scudnn_128x64_relu_interior_nn_v1", Category.CONVOLUTION),
    ("void cutlass_cudnn_infer::Kernel<cutlass_tensorop_s1688fprop_optimized_tf32_64x64_16x10_nhwc_align4>",
     Category.CONVOLUTION),
    ("void cudnn::ops::nchwToNhwcKernel<float, float, float, false, true, (cudnnKernelDataType_t)2>",
     Category.CONVOLUTION),  # the layout transposes cuDNN runs for an NCHW convolution
    ("void at::native::(anonymous namespace)::conv_depthwise2d_forward_kernel<3, float, int>", Category.CONVOLUTION),
    ("void at::native::im2col_kernel<float>", Category.CONVOLUTION),
    # gemms stay matrix products, "convert" is no convolution, cuDNN's batch norm is not one
    ("sm90_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize128x128x16_warpgroupsize1x1x1_execute_segment_k_off",
     Category.MATMUL),
    ("ampere_sgemm_128x64_nn", Category.MATMUL),
    ("void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_16x16_128x2_tn_align2>", Category.MATMUL),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::convert_kernel>", None),
    ("void cudnn::bn_fw_tr_1C11_kernel_NCHW<float, float, int, 512, true, 1>", None),
    # cuDNN's attention kernels are attention's, checked first
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x64", Category.ATTENTION),
])
def test_convolutions_are_told_from_matrix_products_by_their_names(name, category):
    assert category_of(name) == category


def test_recorded_cpu_events_of_a_conv_model_put_most_of_the_step_in_convolutions():
    """Two steps of a small CNN (two 3x3 conv2d layers, a linear head, SGD) on one thread,
    as torch 2.13's profiler recorded them: aten::conv2d (holding mkldnn_convolution) and
    ConvolutionBackward0 are convolution, most of the step; the head's linear is matmul."""
    events = recorded("cpu_conv.json")
    shares = step_shares(events)
    assert shares.steps == 2 and shares.source == "cpu ops"
    assert sum(shares.shares.values()) == pytest.approx(1.0, abs=1e-6)

    def total_ms(name: str) -> float:
        return sum(e.duration for e in events if e.name == name) / 1000.0

    assert shares.ms[Category.CONVOLUTION] == pytest.approx(
        total_ms("aten::conv2d") + total_ms("autograd::engine::evaluate_function: ConvolutionBackward0"))
    assert shares.shares[Category.CONVOLUTION] > 0.5
    assert max(shares.shares, key=lambda c: shares.shares[c]) == Category.CONVOLUTION
    assert 0 < shares.ms[Category.MATMUL] < 0.1 * shares.ms[Category.CONVOLUTION]
    assert shares.ms[Category.ATTENTION] == 0.0


def test_a_profile_written_before_convolutions_had_a_category_reads_back_and_conforms():
    doc = load_doc()
    old = {"step_ms": 4.0, "steps": 20, "device": "cpu", "source": "cpu ops", "measured_step_ms": 4.1,
           "shares": {"matmul": 0.6, "attention": 0.0, "other": 0.2, "optimizer": 0.1, "data_wait": 0.05,
                      "communication": 0.0, "idle": 0.05}}
    written = {**doc.to_json(), "step_profile": old}
    assert schemas.problem(written, "best_config") is None
    read = type(doc).from_json(written)
    assert read.step_profile is not None and read.step_profile.share(Category.CONVOLUTION) == 0.0
    assert read.step_profile.share(Category.MATMUL) == 0.6
    assert type(doc).from_json(read.to_json()) == read
    assert ["convolutions (conv, cuDNN)", "0.0%", "0.00"] not in next(
        t for t in report_tables(read, None) if t.title == "Where the step goes").rows


def _gpu_timeline() -> list[ProfilerEvent]:
    """One step on a GPU, microseconds: the host waits for data over [0, 100) and
    [500, 600); kernels on two streams, with gaps."""
    k = ProfilerEventKind.KERNEL
    return [
        ProfilerEvent(WINDOW, 0, 1000), ProfilerEvent(STEP, 0, 990),
        ProfilerEvent(DATA_WAIT, 0, 100), ProfilerEvent(DATA_WAIT, 500, 100),
        ProfilerEvent("aten::linear", 100, 5), ProfilerEvent("Optimizer.step#AdamW.step", 120, 10),  # host ops: not counted
        ProfilerEvent("sm90_xmma_gemm_f32f32_f32f32_f32_tn_n", 100, 200, k),
        ProfilerEvent("flash_fwd_kernel", 300, 100, k),
        # the optimizer's range on the device's timeline holds its kernels; our step's holds all
        ProfilerEvent("Optimizer.step#AdamW.step", 395, 60, ProfilerEventKind.ANNOTATION), ProfilerEvent(STEP, 0, 1000, ProfilerEventKind.ANNOTATION),
        ProfilerEvent("vectorized_elementwise_kernel<AddFunctor>", 400, 50, k),
        ProfilerEvent("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 450, 50, k),
        ProfilerEvent("vectorized_elementwise_kernel", 460, 20, k, thread=7),  # another stream, under the all-reduce
        # gap [500, 600): the host was in next(batches)
        ProfilerEvent("vectorized_elementwise_kernel", 600, 300, k),
        # gap [900, 1000): nothing runs and the host was not waiting for data
        ProfilerEvent("late_kernel_after_the_window", 1100, 50, k),
    ]


def test_gpu_kernels_divide_the_window_and_its_gaps_are_data_wait_or_idle():
    shares = step_shares(_gpu_timeline())
    assert shares.source == "gpu kernels" and shares.steps == 1 and shares.window_ms == pytest.approx(1.0)
    expected_us = {Category.MATMUL: 200, Category.ATTENTION: 100, Category.OPTIMIZER: 50,
                   Category.COMMUNICATION: 50, Category.OTHER: 300, Category.DATA_WAIT: 200, Category.IDLE: 100,
                   Category.CONVOLUTION: 0}
    assert {c: round(v * 1000) for c, v in shares.ms.items()} == expected_us
    assert sum(shares.shares.values()) == pytest.approx(1.0)


def test_recorded_h100_events_put_cudnn_sdpa_in_attention_and_the_hosts_sleep_in_data_wait():
    """Four steps on an H100 (linear, causal sdpa in bf16, AdamW; a 3 ms sleep in each data
    wait), as torch 2.11's profiler recorded them: the device-side ranges of the steps
    and the optimizer are not kernels, the GPU idle while the host slept is data wait."""
    data = json.loads((FIXTURES / "gpu_sdpa_h100.json").read_text())
    events = recorded("gpu_sdpa_h100.json")
    shares = step_shares(events)
    assert shares.source == "gpu kernels" and shares.steps == 4
    assert sum(shares.shares.values()) == pytest.approx(1.0)
    assert shares.window_ms == pytest.approx(data["measured_window_ms"], rel=0.1)
    assert 11.0 <= shares.ms[Category.DATA_WAIT] <= 12.5  # 4 x 3 ms, less the kernels still running
    kernels = [e for e in events if e.kind == ProfilerEventKind.KERNEL]
    sdpa = sum(e.duration for e in kernels if "sdpa" in e.name) / 1000.0
    assert sdpa > 0 and shares.ms[Category.ATTENTION] >= sdpa
    assert shares.ms[Category.MATMUL] >= sum(e.duration for e in kernels if e.name.startswith("nvjet")) / 1000.0 > 0
    assert shares.ms[Category.OPTIMIZER] > 0
    assert shares.shares[Category.OTHER] < 0.1  # elementwise and loss kernels: a small part here


def test_the_profilers_raw_events_are_read_as_torchs_own_event_list_gives_them():
    """A step that loads its batch sample by sample, profiled in this process: the events
    read from the profiler's raw results are the ones its event list holds, and divide the
    window alike."""
    import torch

    from autotune.runtime.profile import events_of, listed_events_of

    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(64, 1, 8, 8), torch.randint(0, 4, (64,)))
    batches = iter(torch.utils.data.DataLoader(data, batch_size=16))
    model = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.Flatten(), torch.nn.Linear(4 * 6 * 6, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        with torch.profiler.record_function(WINDOW):
            for _ in range(3):
                with torch.profiler.record_function(STEP):
                    with torch.profiler.record_function(DATA_WAIT):
                        x, y = next(batches)
                    torch.nn.functional.cross_entropy(model(x), y).backward()
                    optimizer.step()
    raw, listed = events_of(prof), listed_events_of(prof)

    def key(e: ProfilerEvent) -> tuple:
        return e.start, e.name, e.thread, e.kind

    assert len(raw) == len(listed) > 100
    for a, b in zip(sorted(raw, key=key), sorted(listed, key=key)):
        assert (a.name, a.kind, a.thread) == (b.name, b.kind, b.thread)
        assert a.start == pytest.approx(b.start, abs=1e-3) and a.duration == pytest.approx(b.duration, abs=1e-3)
    assert {"aten::select", "aten::stack", "aten::convolution"} <= {e.name for e in raw}
    shares, expected = step_shares(raw), step_shares(listed)
    assert shares.steps == expected.steps == 3
    assert shares.ms == pytest.approx(expected.ms, abs=1e-6)


def test_events_without_a_window_are_refused():
    with pytest.raises(ValueError, match="autotune.window"):
        step_shares([ProfilerEvent("aten::mm", 0, 10)])


@pytest.mark.slow
def test_the_emitted_script_profiles_a_window_whose_shares_add_up_to_its_measured_step(tmp_path, no_autotune_env):
    """train_tuned.py --profile on a real model: the shares (from the profiler's events)
    times the step (the profiler's window) add up to the step the script's own clock
    measured, within 10%; the model's matrix products, its optimizer step and its
    DataLoader show."""
    out = tmp_path / "out"
    emit_outputs(out, TrialConfig(threads=1, batch_size=16), MODELS / "dropout_cnn.py")
    proc = run_launch_sh(out, tmp_path / "work", no_autotune_env, "--profile", "--no-checkpoint",
                         "--report", "r.json")
    assert "where the step goes" in proc.stdout
    profile = json.loads((tmp_path / "work" / "r.json").read_text())["step_profile"]
    assert profile["device"] == "cpu" and profile["source"] == "cpu ops" and profile["steps"] >= 5
    explained_ms = sum(profile["shares"].values()) * profile["step_ms"]
    assert explained_ms == pytest.approx(profile["measured_step_ms"], rel=0.1)
    for category in ("convolution", "matmul", "optimizer", "data_wait"):
        assert profile["shares"][category] > 0, category
    assert profile["shares"]["communication"] == 0 and profile["shares"]["attention"] == 0


@pytest.mark.slow
def test_with_two_ranks_rank_0_is_profiled_and_its_all_reduce_is_communication(tmp_path, no_autotune_env):
    out = tmp_path / "out"
    emit_outputs(out, TrialConfig(nprocs=2, threads=1, batch_size=16), MODELS / "dropout_cnn.py")
    proc = run_launch_sh(out, tmp_path / "work", no_autotune_env, "--profile", "--no-checkpoint",
                         "--report", "r.json")
    assert proc.stdout.count("where the step goes") == 1  # rank 0's
    profile = json.loads((tmp_path / "work" / "r.json").read_text())["step_profile"]
    assert profile["shares"]["communication"] > 0
    assert sum(profile["shares"].values()) * profile["step_ms"] == pytest.approx(profile["measured_step_ms"], rel=0.1)


def _profiled(data_wait: float, *, config: TrialConfig | None = None, source: str = "cpu ops",
              idle: float = 0.1):
    doc = load_doc()
    shares = {c.value: 0.0 for c in Category}
    shares.update(data_wait=data_wait, idle=idle, matmul=1.0 - data_wait - idle)
    profile = StepProfile(step_ms=4.0, steps=20, device="cpu", source=source, shares=shares, measured_step_ms=4.1)
    return dataclasses.replace(doc, step_profile=profile, config=config or doc.config)


def test_the_step_profile_is_in_best_config_json_the_report_and_the_advice():
    doc = _profiled(0.38)
    written = doc.to_json()
    assert schemas.problem(written, "best_config") is None
    assert type(doc).from_json(written) == doc
    broken = {**written, "step_profile": {**written["step_profile"], "shares": {"matmul": 1.0}}}
    assert "'attention' is a required property" in schemas.problem(broken, "best_config")
    table = next(t for t in report_tables(doc, None) if t.title == "Where the step goes")
    assert table.rows[0] == ["matrix products (mm, linear)", "52.0%", "2.08"]
    assert ["waiting for data (next batch)", "38.0%", "1.52"] in table.rows
    lines = advice.advise(doc)
    assert any(line.startswith("where the step goes (4.00 ms, profiled)") for line in lines)
    assert any("waits on the DataLoader 38% of the time" in line and "__getitem__" in line for line in lines)
    assert not any("DataLoader" in line for line in advice.advise(_profiled(0.05)))


def test_a_convolution_bound_step_is_advised_with_what_its_convolutions_run_with():
    doc = load_doc()  # bf16 and channels_last on, on CPU
    shares = {c.value: 0.0 for c in Category}
    shares.update(convolution=0.7, matmul=0.1, other=0.2)
    profile = StepProfile(step_ms=4.0, steps=20, device="cpu", source="cpu ops", shares=shares)
    table = next(t for t in report_tables(dataclasses.replace(doc, step_profile=profile), None)
                 if t.title == "Where the step goes")
    assert table.rows[0] == ["convolutions (conv, cuDNN)", "70.0%", "2.80"]
    picked = advice.advise(dataclasses.replace(doc, step_profile=profile))
    assert "  convolutions take 70% of the step: they run in bf16, channels_last on; the search's space held no " \
           "other layout, cuDNN benchmark or 16-bit precision for them." in picked
    plain = dataclasses.replace(doc, step_profile=profile, config=doc.config.replace(precision="fp32",
                                                                                      channels_last=False))
    assert any("they run in fp32, channels_last off; the search's space held channels_last=true, precision=bf16 "
               "as well" in line for line in advice.advise(plain))
    small = {**shares, "convolution": 0.3, "other": 0.6}
    assert not any("convolutions take" in line for line in advice.advise(
        dataclasses.replace(doc, step_profile=dataclasses.replace(profile, shares=small))))


def test_the_data_advice_says_what_the_search_did_with_more_workers():
    doc = _profiled(0.4, config=load_doc().config.replace(num_workers=1))
    space = [str(v) for v in doc.included["num_workers"]]
    more = [v for v in space if int(v) > 1]
    assert more, "the recorded space holds more workers than the emitted 1"
    tried = advice_lines(doc, workers_tried=["0", "1", *more])
    assert f"more workers ({', '.join(more)}) were tried and lost to 1" in tried[1]
    untried = advice_lines(doc, workers_tried=["0", "1"])
    assert f"{', '.join(more)} workers were not tried" in untried[1]


def test_a_stand_in_runner_measures_nothing_so_nothing_is_profiled(tmp_path):
    from autotune.emit.step_profile import profile_emitted
    from autotune.report.console import Reporter

    from doubles import RunnerDouble

    doc = load_doc()
    reporter = Reporter(quiet=True)
    assert profile_emitted(tmp_path, doc, runner=RunnerDouble(), profile=RunOptions().profile, reporter=reporter) is doc


def test_no_profile_on_the_command_line_turns_the_profile_off(monkeypatch, tmp_path):
    from autotune import cli, pipeline

    seen = []

    def tune(model_file, *, out, options, reporter, force=False, script_args=()):
        seen.append(options.profile)
        raise SystemExit(0)

    monkeypatch.setattr(pipeline, "tune", tune)
    for argv in (["run", str(tmp_path / "m.py"), "--no-profile"], ["run", str(tmp_path / "m.py")]):
        with pytest.raises(SystemExit):
            cli.main(argv)
    assert seen == [False, True]
