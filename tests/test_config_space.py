"""TrialConfig validation, --fix parsing and the search space built from a probe
document (fast: no subprocesses)."""
from __future__ import annotations

import dataclasses
import itertools
import json

import pytest

from autotune.config import TrialConfig
from autotune.errors import UsageError
from autotune.options import parse_fixes
from autotune.runtime.knobs import (
    Affinity,
    Allocator,
    Backend,
    CompileMode,
    ConfigDict,
    Device,
    LrScaling,
    OptimizerStep,
    Precision,
    Sharding,
)
from autotune.space import build_space


def probe(cores: int, **isa: bool) -> dict:
    """A minimal fake probe document: a CPU-only machine with `cores` usable cores."""
    return {
        "cpu": {"usable_cores": cores, "usable_cpus": list(range(cores)), "isa": dict(isa)},
        "backends": {"gloo": True},
        "gpus": [],
    }


def layouts(space) -> set[tuple[int, int]]:
    return set(space.layouts)


# --- TrialConfig ----------------------------------------------------------------------------


def test_from_dict_round_trips():
    cfg = TrialConfig(nprocs=2, threads=1, batch_size=64, num_workers=2, precision="bf16")
    assert TrialConfig.from_dict(cfg.to_dict()) == cfg


def test_a_configuration_read_from_json_holds_the_vocabularies_members():
    """JSON holds a knob's value; the configuration holds the enum's member, compares with
    the value as well, and writes the value back: old files read as they did."""
    written = {"batch_size": 64, "nprocs": 2, "device": "cuda", "affinity": "compact",
               "precision": "bf16", "compile": "max-autotune", "allocator": "tcmalloc",
               "backend": "nccl", "sharding": "full", "optimizer_step": "default", "lr_scaling": "sqrt"}
    cfg = TrialConfig.from_dict(written)
    assert cfg.device is Device.CUDA and cfg.affinity is Affinity.COMPACT
    assert cfg.precision is Precision.BF16 and cfg.compile is CompileMode.MAX_AUTOTUNE
    assert cfg.allocator is Allocator.TCMALLOC and cfg.backend is Backend.NCCL
    assert cfg.sharding is Sharding.FULL and cfg.optimizer_step is OptimizerStep.DEFAULT
    assert cfg.lr_scaling is LrScaling.SQRT
    assert TrialConfig().device is Device.CPU and TrialConfig().affinity is Affinity.NONE
    assert cfg == TrialConfig(**{**written, "device": Device.CUDA, "backend": Backend.NCCL})
    assert hash(cfg) == hash(TrialConfig.from_dict(written))
    plain = cfg.to_dict()
    assert {k: plain[k] for k in written} == written
    assert all(type(plain[k]) is str for k in written if isinstance(written[k], str))
    assert json.loads(json.dumps(plain)) == plain
    assert "device=cuda" in cfg.short() and "affinity=compact" in cfg.short()


def test_the_runtime_reads_every_knob_a_configuration_has():
    """The runtime cannot import TrialConfig (it ships without autotune): its typed view of
    a configuration must name the same knobs, or a new knob never reaches a trial's typing."""
    assert set(ConfigDict.__annotations__) == {f.name for f in dataclasses.fields(TrialConfig)}


def test_from_dict_rejects_unknown_keys_and_lists_the_known_knobs():
    with pytest.raises(UsageError) as info:
        TrialConfig.from_dict({"batch_size": 32, "batchsize": 64, "warp_speed": True})
    msg = str(info.value)
    assert "batchsize" in msg and "warp_speed" in msg
    assert "known knobs:" in msg
    known = msg.split("known knobs:")[1]
    for knob in ("batch_size", "nprocs", "threads", "num_workers", "precision", "compile"):
        assert knob in known


@pytest.mark.parametrize("knobs, words", [
    ({"nprocs": 4, "batch_size": 30}, ["batch_size=30", "nprocs=4", "divide evenly"]),
    ({"precision": "fp8"}, ["precision='fp8'", "fp32", "bf16"]),
    ({"compile": "fast"}, ["compile='fast'", "max-autotune"]),
    ({"device": "tpu"}, ["device='tpu'", "is not one of cpu, cuda"]),
    ({"affinity": "scatter"}, ["affinity='scatter'", "is not one of none, compact"]),
    ({"batch_size": 0}, ["batch_size=0", "at least 1"]),
    ({"threads": 0}, ["threads=0", "at least 1"]),
    ({"num_workers": -1}, ["num_workers=-1"]),
    ({"prune_ratio": 1.0}, ["prune_ratio=1.0"]),
])
def test_invalid_values_raise_usage_error(knobs, words):
    with pytest.raises(UsageError) as info:
        TrialConfig(**knobs)
    for word in words:
        assert word in str(info.value)


def test_per_rank_batch_and_layout():
    cfg = TrialConfig(nprocs=2, threads=1, batch_size=64)
    assert cfg.per_rank_batch == 32 and cfg.layout == "2x1"
    assert TrialConfig().layout == "1xdefault"


# --- --fix ----------------------------------------------------------------------------------


def test_parse_fixes_types_the_values():
    fixed = parse_fixes(["batch_size=64", "precision=fp32", "channels_last=on",
                         "threads=default", "prune_ratio=0.25", " nprocs = 2"])
    assert fixed == {"batch_size": 64, "precision": "fp32", "channels_last": True,
                     "threads": None, "prune_ratio": 0.25, "nprocs": 2}
    assert parse_fixes([]) == {}


def test_parse_fixes_rejects_an_unknown_knob_and_lists_the_knobs():
    with pytest.raises(UsageError) as info:
        parse_fixes(["batchsize=64"])
    msg = str(info.value)
    assert "batchsize" in msg and "unknown knob" in msg
    assert "batch_size" in msg and "precision" in msg


@pytest.mark.parametrize("item, words", [
    ("batch_size=big", ["batch_size=big", "expected int"]),
    ("channels_last=maybe", ["channels_last=maybe", "expected bool"]),
    ("precision=fp8", ["precision='fp8'"]),
    ("batch_size=0", ["batch_size=0"]),
])
def test_parse_fixes_rejects_a_bad_value(item, words):
    with pytest.raises(UsageError) as info:
        parse_fixes([item])
    for word in words:
        assert word in str(info.value)


def test_parse_fixes_rejects_batch_that_does_not_split_over_fixed_ranks():
    with pytest.raises(UsageError) as info:
        parse_fixes(["nprocs=2", "batch_size=33"])
    assert "divide evenly" in str(info.value)


@pytest.mark.parametrize("item", ["batch_size", "=64", "batch_size:64"])
def test_parse_fixes_rejects_a_missing_equals_sign(item):
    with pytest.raises(UsageError) as info:
        parse_fixes([item])
    assert "expected KNOB=VALUE" in str(info.value)


# --- build_space ----------------------------------------------------------------------------


def test_layouts_on_two_cores():
    space = build_space(probe(2))
    assert sorted(space.choices["layout"]) == ["1x1", "1x2", "2x1"]


def test_layouts_on_four_cores():
    got = layouts(build_space(probe(4)))
    assert {(2, 2), (4, 1), (1, 4)} <= got
    assert all(n * t <= 4 for n, t in got)


@pytest.mark.parametrize("cores", range(1, 9))
def test_layouts_never_oversubscribe_the_cores(cores):
    got = layouts(build_space(probe(cores)))
    assert (1, cores) in got  # every core in one process is always a candidate
    assert all(n * t <= cores for n, t in got)
    if cores == 1:
        assert got == {(1, 1)}


# With 3+ cores the layouts include 3, 5, 6 or 7 ranks, which split no power-of-two batch
# evenly: such a layout must go, or the sampler draws e.g. 3x1 with batch 32 and the
# TrialConfig raises inside the search.


@pytest.mark.parametrize("cores", [1, 2, 3, 4, 6])
def test_every_point_of_the_space_is_a_valid_configuration(cores):
    """The sampler may combine any layout with any batch size: each combination must make a
    valid TrialConfig, or suggesting it raises inside the search and ends the run."""
    space = build_space(probe(cores), baseline_batch=32, dataset_len=10_000)
    base = {name: values[0] for name, values in space.choices.items()}
    bad = []
    for layout, batch in itertools.product(space.choices["layout"], space.choices["batch_size"]):
        try:
            space.config_from_params({**base, "layout": layout, "batch_size": batch})
        except UsageError:
            bad.append(f"{layout}@{batch}")
    assert bad == [], f"invalid combinations in the space: {bad}"


def test_fixed_layout_narrows_the_space():
    space = build_space(probe(4), fixed={"nprocs": 2})
    assert layouts(space) == {(2, 1), (2, 2)}
    space = build_space(probe(4), fixed={"nprocs": 1, "threads": 2})
    assert space.choices["layout"] == ["1x2"]
    with pytest.raises(UsageError):
        build_space(probe(2), fixed={"nprocs": 2, "threads": 2})


def test_batchnorm_models_keep_to_one_process_and_say_why():
    """Several CPU ranks would each normalize their own share of the batch: training
    changes and verification rejects it, so the search must not spend trials there."""
    space = build_space(probe(4), batchnorm_layers=("features.1", "features.5"))
    assert layouts(space) == {(1, 1), (1, 2), (1, 3), (1, 4)}
    reason = space.describe()["excluded"]["nprocs>1"]
    assert "BatchNorm" in reason and "'features.1'" in reason
    assert {n for n, _ in layouts(build_space(probe(4)))} >= {2, 4}  # without BatchNorm


def test_fixing_several_ranks_on_a_batchnorm_model_is_refused():
    with pytest.raises(UsageError) as info:
        build_space(probe(2), batchnorm_layers=("bn",), fixed={"nprocs": 2})
    assert "--fix nprocs=2" in str(info.value) and "BatchNorm" in str(info.value)
    space = build_space(probe(2), batchnorm_layers=("bn",), fixed={"nprocs": 1})
    assert layouts(space) == {(1, 1), (1, 2)}


def test_batch_sizes_around_the_baseline_bounded_by_the_dataset():
    space = build_space(probe(2), baseline_batch=32, dataset_len=100)
    batches = space.choices["batch_size"]
    assert 32 in batches and 64 in batches and 8 in batches
    assert max(batches) <= 100
    assert any(key.startswith("batch_size>") for key in space.excluded)
    assert build_space(probe(2), fixed={"batch_size": 48}).choices["batch_size"] == [48]


def test_baseline_is_the_users_setup():
    space = build_space(probe(2), baseline_batch=24)
    assert space.baseline == TrialConfig(batch_size=24)  # 1 process, default threads, fp32, ...


def test_bf16_excluded_without_native_support_with_a_reason():
    space = build_space(probe(2, avx512f=True, avx512_vnni=True))
    assert space.choices["precision"] == ["fp32"]
    reason = space.excluded["precision=bf16"]
    assert "avx512_bf16" in reason


@pytest.mark.parametrize("flag", ["amx_bf16", "avx512_bf16"])
def test_bf16_included_with_native_support(flag):
    space = build_space(probe(2, **{flag: True}))
    assert "bf16" in space.choices["precision"]
    assert "precision=bf16" not in space.excluded


def test_a_pinned_knob_is_honoured_even_where_the_search_would_skip_it():
    space = build_space(probe(2), fixed={"precision": "bf16"})
    assert space.choices["precision"] == ["bf16"]


def test_gpu_only_precisions_are_excluded_on_cpu():
    space = build_space(probe(2))
    assert "fp16" not in space.choices["precision"] and "tf32" not in space.choices["precision"]
    assert "precision=fp16" in space.excluded and "precision=tf32" in space.excluded


def test_no_included_value_is_also_reported_as_excluded():
    space = build_space(probe(4), baseline_batch=32)
    for key in space.excluded:
        name, _, values = key.partition("=")
        if name in space.choices and values:
            listed = {v.strip() for v in values.split(",")}
            included = {str(v) for v in space.choices[name]}
            assert not listed & included, f"{key} is excluded but {space.choices[name]} included"


def _gpu_machine(gpus: int, capability: str) -> dict:
    return {
        "cpu": {"usable_cores": 16, "usable_cpus": list(range(16)), "isa": {}},
        "gpus": [{"index": i, "name": "NVIDIA H100 80GB HBM3", "memory_bytes": None,
                  "compute_capability": capability} for i in range(gpus)],
        "torch": {"cuda_available": True},
        "backends": {"gloo": True, "nccl": True},
        "compile": {"available": True},
        "allocators": {"jemalloc": "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"},
    }


def test_gpu_machine_tunes_on_the_gpus_with_their_knobs():
    space = build_space(_gpu_machine(2, "9.0"), baseline_batch=64)
    assert space.baseline.device == "cuda" and space.baseline.backend == "nccl"
    assert [s.split("x")[0] for s in space.choices["layout"]] == ["1", "2"]  # one rank per GPU
    assert space.choices["backend"] == ["nccl"]
    assert set(space.choices["precision"]) == {"fp32", "fp16", "bf16", "tf32"}
    assert "reduce-overhead" in space.choices["compile"]
    assert space.choices["pin_memory"] == [False, True]
    assert "allocator" not in space.choices and "allocator" in space.excluded


def test_interop_threads_are_searched_on_cpu_only():
    """On GPUs the inter-op pool does little, and each of its values is a process of its
    own (a process knob): not searched, with the reason; a pin still applies."""
    gpu = build_space(_gpu_machine(1, "9.0"), baseline_batch=64)
    assert "interop_threads" not in gpu.choices
    assert "process" in gpu.excluded["interop_threads"]
    assert build_space(probe(4), baseline_batch=32).choices["interop_threads"] == [None, 1]
    pinned = build_space(_gpu_machine(1, "9.0"), baseline_batch=64, fixed={"interop_threads": 1})
    assert pinned.fixed == {"interop_threads": 1} and "interop_threads" not in pinned.choices


def test_pre_ampere_gpu_has_no_bf16_or_tf32():
    space = build_space(_gpu_machine(1, "7.0"), baseline_batch=64)
    assert set(space.choices["precision"]) == {"fp32", "fp16"}
    assert "Ampere" in space.excluded["precision=bf16,tf32"]


def test_cuda_config_starts_one_rank_per_gpu_over_loopback():
    from autotune.config import TrialConfig
    from autotune.trials import launch

    cfg = TrialConfig(nprocs=2, threads=8, device="cuda", backend="nccl", batch_size=64,
                      precision="fp16")
    assert launch.command(cfg, ["train_tuned.py"], python="python") == ["python", "train_tuned.py"]
    env, _ = launch.environment(cfg, machine=_gpu_machine(2, "9.0"), base_env={})
    lo = launch.loopback_interface()
    # the script starts 2 ranks, whose gloo and NCCL sockets bind the loopback interface;
    # no CPU pinning of GPU ranks; device indices in NVML's (PCI) order
    assert env == {"OMP_NUM_THREADS": "8", "TUNED_NPROCS": "2", "GLOO_SOCKET_IFNAME": lo,
                   "NCCL_SOCKET_IFNAME": lo, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


def test_a_layout_is_written_and_read_as_ranks_x_threads():
    from autotune.config import Layout

    assert Layout.parse("2x1") == Layout(2, 1) and str(Layout(2, 1)) == "2x1"
    assert Layout.parse("1xdefault") == Layout(1, None) and str(Layout(1, None)) == "1xdefault"
    assert str(Layout.parse(TrialConfig(nprocs=4, threads=2, batch_size=8).layout)) == "4x2"
    for bad in ("2", "x1", "2x", "0x1", "2x0", "twoxone"):
        with pytest.raises(UsageError, match="expected RANKSxTHREADS"):
            Layout.parse(bad)
    # --fix takes the layout as every progress line prints it
    assert parse_fixes(["layout=2x1"]) == {"nprocs": 2, "threads": 1}
    space = build_space(probe(4), baseline_batch=32, fixed=parse_fixes(["layout=2x1"]))
    assert space.choices["layout"] == ["2x1"]
    with pytest.raises(UsageError, match="--fix layout '2'"):
        parse_fixes(["layout=2"])
