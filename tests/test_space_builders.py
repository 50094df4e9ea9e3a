"""The per-knob builders of autotune/space/choices.py, each on its own inputs, and build_space on
a typed Machine (fast: no subprocesses)."""
from __future__ import annotations

import pytest

from autotune.errors import UsageError
from autotune.probes import Machine
from autotune.probes.compiler import CompilerCheck
from autotune.probes.cuda_visible import visible_gpus
from autotune.probes.gpu import GpuInfo
from autotune.space import build_space
from autotune.space.choices import (
    allocator_choice,
    batch_size_choice,
    compile_choice,
    device_choice,
    layout_choice,
    pairable,
    precision_choice,
    prune_ratio_choice,
)

from doubles import recorded_machine


def gpu(index: int, capability: str | None = "9.0", uuid: str | None = None) -> GpuInfo:
    return GpuInfo(index=index, name="NVIDIA H100", memory_bytes=None,
                   compute_capability=capability, uuid=uuid)


# --- device and GPUs ------------------------------------------------------------------------


def test_visible_gpus_reads_indices_and_uuids_as_cuda_does():
    gpus = [gpu(i, uuid=f"GPU-{i}aaa") for i in range(4)]
    assert visible_gpus(gpus, None) == (gpus, [])
    assert visible_gpus(gpus, "") == ([], ["0", "1", "2", "3"])
    assert visible_gpus(gpus, "2,0") == ([gpus[2], gpus[0]], ["1", "3"])
    assert visible_gpus(gpus, "GPU-3") == ([gpus[3]], ["0", "1", "2"])  # a UUID prefix
    # the list ends at the first entry that names no GPU, or names one again
    assert visible_gpus(gpus, "1,7,2") == ([gpus[1]], ["0", "2", "3"])
    assert visible_gpus(gpus, "1,1,2") == ([gpus[1]], ["0", "2", "3"])


def test_device_is_cpu_without_a_usable_gpu_and_says_why():
    assert device_choice([gpu(0)], [], cuda_available=True, pinned=None).values == ["cuda"]
    no_torch = device_choice([gpu(0)], [], cuda_available=False, pinned=None)
    assert no_torch.values == ["cpu"] and "cannot use them" in no_torch.excluded["device=cuda"]
    hidden = device_choice([], ["0", "1"], cuda_available=True, pinned=None)
    assert hidden.values == ["cpu"]
    assert hidden.excluded == {"gpus=0,1": "hidden by CUDA_VISIBLE_DEVICES",
                               "device=cuda": "no NVIDIA GPU found visible"}
    with pytest.raises(UsageError, match="--fix device=cuda"):
        device_choice([], [], cuda_available=False, pinned="cuda")


# --- layout and batch size ------------------------------------------------------------------


def test_layout_builder_keeps_a_batchnorm_model_to_one_rank_and_says_why():
    choice = layout_choice("cpu", 4, 0, {"gloo": True}, batchnorm_layers=("f.1", "f.5", "f.9", "f.12"),
                            nprocs=None, threads=None)
    assert choice.values == ["1x1", "1x2", "1x3", "1x4"]
    reason = choice.excluded["nprocs>1"]
    assert "BatchNorm" in reason and "'f.1', 'f.5', 'f.9', ..." in reason and "'f.12'" not in reason
    with pytest.raises(UsageError, match="--fix nprocs=2: the model has BatchNorm"):
        layout_choice("cpu", 4, 0, {"gloo": True}, batchnorm_layers=("bn",), nprocs=2, threads=None)


def test_layout_builder_without_a_working_backend_keeps_one_rank():
    cpu = layout_choice("cpu", 2, 0, {"gloo": False}, batchnorm_layers=(), nprocs=None, threads=None)
    assert cpu.values == ["1x1", "1x2"] and "gloo" in cpu.excluded["nprocs>1"]
    cuda = layout_choice("cuda", 16, 4, {"nccl": False}, batchnorm_layers=(), nprocs=None, threads=None)
    assert cuda.values == ["1xdefault"] and "NCCL" in cuda.excluded["nprocs>1"]
    both = layout_choice("cuda", 16, 4, {"nccl": True}, batchnorm_layers=(), nprocs=None, threads=None)
    assert both.values == ["1xdefault", "2x8", "3x5", "4x4"] and both.excluded == {}


def test_one_gpu_rank_leaves_its_threads_to_pytorch_as_the_baseline_does_unless_pinned(monkeypatch):
    """One rank on a GPU runs with PyTorch's default threads, as the baseline: a count of its
    own would differ from the baseline in nothing that matters. Several ranks share the
    host's cores; pinned threads apply to every rank count that holds them."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    space = build_space(recorded_machine("h100x1"), baseline_batch=16)
    assert space.choices["layout"] == ["1xdefault"]
    assert space.layouts[0].threads == space.baseline.threads is None
    pinned = layout_choice("cuda", 16, 4, {"nccl": True}, batchnorm_layers=(), nprocs=None, threads=4)
    assert pinned.values == ["1x4", "2x4", "3x4", "4x4"]
    assert layout_choice("cuda", 16, 4, {"nccl": True}, batchnorm_layers=(), nprocs=2, threads=8).values == ["2x8"]


def test_layout_builder_applies_pinned_ranks_and_threads():
    choice = layout_choice("cpu", 4, 0, {"gloo": True}, batchnorm_layers=(), nprocs=2, threads=None)
    assert choice.values == ["2x1", "2x2"]
    with pytest.raises(UsageError, match="leaves no layout within the 2 usable cores"):
        layout_choice("cpu", 2, 0, {"gloo": True}, batchnorm_layers=(), nprocs=2, threads=2)


def test_batch_sizes_stay_within_the_dataset_and_a_pin_replaces_them():
    choice = batch_size_choice(32, 100, None)
    assert choice.values == [8, 16, 32, 64] and choice.excluded == {"batch_size>100": "larger than the dataset"}
    assert batch_size_choice(24, None, None).values == [8, 16, 24, 32, 64, 128, 256]
    assert batch_size_choice(64, 10, None).values == [64]  # nothing fits: the user's own batch
    assert batch_size_choice(32, 100, 48).values == [48]


def test_layouts_whose_ranks_split_no_batch_go():
    choice = pairable(["1x3", "2x1", "3x1", "8x1"], [16, 32])
    assert choice.values == ["1x3", "2x1", "8x1"]
    assert choice.excluded == {"layout=3x1": "its ranks split none of the batch sizes evenly"}
    assert pairable(["3x1"], [16]).values == ["3x1"]  # the first stays if none splits
    # a rank count that splits only some batch sizes stays: the search skips the other pairs
    assert pairable(["1x4", "8x4"], [4, 8, 16, 50]).values == ["1x4", "8x4"]


# --- compile and precision ------------------------------------------------------------------


def test_compile_is_off_on_cpu_without_a_compiler_and_names_why():
    choice = compile_choice("cpu", CompilerCheck(available=False, reason="g++ not found"))
    assert choice.values == ["off"]
    assert choice.excluded == {"compile": "torch.compile needs a working C++ compiler: g++ not found"}
    assert "none found" in compile_choice("cpu", CompilerCheck()).excluded["compile"]


def test_cuda_graphs_are_searched_on_gpus_only():
    cpu = compile_choice("cpu", CompilerCheck(available=True))
    assert cpu.values == ["off", "default", "max-autotune-no-cudagraphs"]
    assert "compile=reduce-overhead" in cpu.excluded
    cuda = compile_choice("cuda", CompilerCheck(available=True))
    assert cuda.values[-1] == "reduce-overhead" and cuda.excluded == {}
    # Triton builds its kernel launchers with the host's C compiler: none, no compile
    bare = compile_choice("cuda", CompilerCheck(available=False, reason="no cc"))
    assert bare.values == ["off"] and "Triton" in bare.excluded["compile"]


def test_precision_builder_excludes_emulated_bf16_on_cpu_with_the_reason():
    choice = precision_choice("cpu", [], {"avx512f": True, "avx512_vnni": True}, exact=False)
    assert choice.values == ["fp32"]
    assert "avx512_bf16/AMX" in choice.excluded["precision=bf16"]
    assert {"precision=fp16", "precision=tf32"} <= set(choice.excluded)
    amx = precision_choice("cpu", [], {"amx_bf16": True}, exact=False)
    assert amx.values == ["fp32", "bf16"] and "precision=bf16" not in amx.excluded


def test_precision_builder_follows_the_best_visible_gpu():
    assert precision_choice("cuda", [gpu(0, "7.0"), gpu(1, "8.0")], {}, exact=False).values == [
        "fp32", "fp16", "bf16", "tf32"]
    volta = precision_choice("cuda", [gpu(0, "7.0"), gpu(1, None)], {}, exact=False)
    assert volta.values == ["fp32", "fp16"] and "Ampere" in volta.excluded["precision=bf16,tf32"]


def test_exact_names_the_precisions_it_leaves_out():
    choice = precision_choice("cuda", [gpu(0)], {}, exact=True)
    assert choice.excluded["precision=fp16,bf16,tf32"] == "--exact keeps fp32"
    assert precision_choice("cpu", [], {}, exact=True).excluded.keys() == {
        "precision=bf16", "precision=fp16", "precision=tf32"}


# --- pruning and host knobs -----------------------------------------------------------------


def test_pruning_is_searched_only_when_quality_can_be_bounded_and_names_each_missing_part():
    ready = dict(exact=False, has_evaluate=True, has_training_step=False, max_quality_drop=0.01,
                 pruning_installed=True)
    assert prune_ratio_choice(**ready).values == [0.0, 0.1, 0.25, 0.5]
    choice = prune_ratio_choice(exact=True, has_evaluate=False, has_training_step=True,
                                 max_quality_drop=None, pruning_installed=False)
    assert choice.values == []
    reason = choice.excluded["prune_ratio"]
    for part in ("--exact", "evaluate(model)", "--max-quality-drop", "torch-pruning is not installed",
                 "training_step"):
        assert part in reason
    assert "--max-quality-drop" not in prune_ratio_choice(
        **{**ready, "has_evaluate": False}).excluded["prune_ratio"]


def test_allocators_are_the_default_plus_those_found():
    choice = allocator_choice("cpu", {"jemalloc": "/usr/lib/libjemalloc.so.2", "tcmalloc": None})
    assert choice.values == ["default", "jemalloc"]
    assert choice.excluded == {"allocator=tcmalloc": "libtcmalloc was not found on this machine"}
    cuda = allocator_choice("cuda", {"jemalloc": "/usr/lib/libjemalloc.so.2"})
    assert cuda.values == [] and "allocator" in cuda.excluded


# --- build_space ----------------------------------------------------------------------------


DOC = {"cpu": {"usable_cores": 4, "usable_cpus": [0, 1, 2, 3], "isa": {"amx_bf16": True}},
       "backends": {"gloo": True}, "gpus": [], "compile": {"available": True},
       "allocators": {"tcmalloc": "/usr/lib/libtcmalloc.so.4"}}


def test_a_probe_and_its_document_give_the_same_space():
    probe = Machine.from_json(DOC)
    assert isinstance(probe, Machine)
    kw = dict(baseline_batch=16, dataset_len=1000, image_inputs=True, batchnorm_layers=("bn",))
    typed, doc = build_space(probe, **kw), build_space(DOC, **kw)
    assert typed.describe() == doc.describe() and typed.baseline == doc.baseline
    assert typed.choices["precision"] == ["fp32", "bf16"]
    assert typed.choices["allocator"] == ["default", "tcmalloc"]


def test_a_pin_of_a_knob_left_out_applies_to_every_trial():
    """pin_memory is not searched on CPU: its pin stays in Space.fixed; a pin of a searched
    knob narrows it to the pinned value instead."""
    space = build_space(DOC, fixed={"pin_memory": True, "num_workers": 2})
    assert space.fixed == {"pin_memory": True}
    assert space.choices["num_workers"] == [2] and "pin_memory" not in space.choices
    base = {name: values[0] for name, values in space.choices.items()}
    cfg = space.config_from_params(base)
    assert cfg.pin_memory is True and cfg.num_workers == 2
