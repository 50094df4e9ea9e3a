"""The GPU knobs: expandable segments, float8 training (torchao) and DDP's bucket view and
static graph. Where each is searched (the recorded H100 nodes, an A100 made from one) and
why not (CPU, one rank, no torchao); how a trial's environment, launch.sh and the stack
files carry them; and that each takes effect in a trial process and in the emitted script
(on CPU, where they can: the variable is set, DDP has the options; float8's conversion
through a stand-in torchao, which records what it converted)."""
from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import types

import pytest
import torch

from autotune.config import TrialConfig
from autotune.emit import outputs, stacks
from autotune.errors import UsageError
from autotune.runtime import gpu_knobs
from autotune.space import build_space
from autotune.space import gpu as gpu_space
from autotune.trials import launch
from autotune.trials.runner import Measurement, TrialRunner, process_key
from autotune.verify import ablation

from doubles import recorded_machine
from helpers import MODELS, machine_doc, run_document, run_launch_sh

TINY = MODELS / "tiny_cnn.py"
GPU_KNOBS = ("expandable_segments", "float8", "ddp_bucket_view", "ddp_static_graph")


@pytest.fixture(autouse=True)
def _all_gpus_visible(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


@pytest.fixture
def torchao_installed(monkeypatch):
    """The probe finds torchao.float8 importable."""
    monkeypatch.setattr(gpu_space, "torchao_float8", lambda: None)


def with_capability(doc: dict, capability: str) -> dict:
    """The machine document with every GPU's compute capability set to ``capability``."""
    doc = copy.deepcopy(doc)

    def walk(node):
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "compute_capability":
                    node[key] = capability
                else:
                    walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(doc)
    return doc


# --- the space ----------------------------------------------------------------------------

def test_on_cpu_the_gpu_knobs_are_not_searched_and_the_reasons_say_why():
    space = build_space(recorded_machine("avx2_epyc"), baseline_batch=16)
    assert not set(GPU_KNOBS) & set(space.choices)
    assert "CUDA caching allocator" in space.excluded["expandable_segments"]
    assert "CUDA GPU of compute capability 8.9" in space.excluded["float8"]
    assert "several GPU ranks" in space.excluded["ddp_bucket_view,ddp_static_graph"]


def test_one_h100_searches_expandable_segments_and_float8_with_torchao(torchao_installed):
    space = build_space(recorded_machine("h100x1"), baseline_batch=16)
    assert space.choices["expandable_segments"] == [False, True]
    assert space.choices["float8"] == [False, True]
    assert "one rank" in space.excluded["ddp_bucket_view,ddp_static_graph"]


def test_float8_is_excluded_without_torchao(monkeypatch):
    monkeypatch.setattr(gpu_space, "torchao_float8", lambda: "torchao is not installed (pip install ...)")
    space = build_space(recorded_machine("h100x1"), baseline_batch=16)
    assert "float8" not in space.choices
    assert "torchao is not installed" in space.excluded["float8"]


def test_the_torchao_probe_names_a_missing_torchao(monkeypatch):
    import importlib.util

    gpu_space.torchao_float8.cache_clear()
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    try:
        assert "torchao is not installed" in (gpu_space.torchao_float8() or "")
    finally:
        gpu_space.torchao_float8.cache_clear()


def test_an_a100_excludes_float8_for_its_compute_capability(torchao_installed):
    space = build_space(with_capability(recorded_machine("h100x1"), "8.0"), baseline_batch=16)
    assert "float8" not in space.choices
    assert "compute capability 8.9" in space.excluded["float8"] and "this one is 8" in space.excluded["float8"]
    assert space.choices["expandable_segments"] == [False, True]  # any CUDA GPU


def test_exact_excludes_float8(torchao_installed):
    space = build_space(recorded_machine("h100x1"), baseline_batch=16, exact=True)
    assert "float8" not in space.choices and "bf16" in space.excluded["float8"]


def test_eight_h100s_search_the_ddp_options_for_several_ranks_only(torchao_installed):
    space = build_space(recorded_machine("h100x8"), baseline_batch=16)
    assert space.choices["ddp_bucket_view"] == [False, True]
    assert space.choices["ddp_static_graph"] == [False, True]
    params = {**{name: values[0] for name, values in space.choices.items()}, "batch_size": 16}
    several = space.config_from_params({**params, "layout": "8x1", "ddp_bucket_view": True,
                                        "ddp_static_graph": True})
    assert several.ddp_bucket_view and several.ddp_static_graph
    one = space.config_from_params({**params, "layout": "1xdefault", "ddp_bucket_view": True,
                                    "ddp_static_graph": True})
    assert not one.ddp_bucket_view and not one.ddp_static_graph  # no DDP: normalised off
    sharded = space.config_from_params({**params, "layout": "8x1", "sharding": "full", "ddp_static_graph": True})
    assert not sharded.ddp_static_graph


def test_float8_is_tried_late_compiled_in_bf16(torchao_installed):
    """float8 is no sampled knob (sampled configurations are uncompiled, where it cannot
    run): the late stage tries it on the best configuration, in bf16 and compiled."""
    space = build_space(recorded_machine("h100x1"), baseline_batch=16)
    params = {name: values[0] for name, values in space.choices.items()}
    assert space.config_from_params({**params, "float8": True}).float8 is False  # fp32, uncompiled
    best = space.baseline.replace(precision="fp32")
    variants = [v for v in space.late_variants(best) if v.get("float8")]
    assert len(variants) == 1
    cfg = space.config_from_params(variants[0])
    assert cfg.float8 and cfg.precision == "bf16" and cfg.compile == "reduce-overhead"
    compiled = space.baseline.replace(precision="bf16", compile="default")
    [variant] = [v for v in space.late_variants(compiled) if v.get("float8")]
    assert space.config_from_params(variant).compile == "default"  # its own mode kept


def test_float8_needs_compiled_bf16_and_is_not_exact():
    with pytest.raises(UsageError, match="float8=true needs precision=bf16"):
        TrialConfig(device="cuda", float8=True, precision="fp32", compile="default")
    with pytest.raises(UsageError, match="float8=true needs precision=bf16"):
        TrialConfig(device="cuda", float8=True, precision="bf16")
    cfg = TrialConfig(device="cuda", float8=True, precision="bf16", compile="default")
    assert not cfg.exact  # judged by the numerics and quality gates, as bf16 is


def test_expandable_segments_needs_a_process_of_its_own():
    cfg = TrialConfig(device="cuda", backend="nccl")
    assert process_key(cfg) != process_key(cfg.replace(expandable_segments=True))


# --- what each knob is worth ----------------------------------------------------------------

def test_the_ablation_reverts_each_gpu_knob():
    baseline = TrialConfig(device="cuda", backend="nccl", batch_size=32)
    winner = baseline.replace(nprocs=2, threads=4, precision="bf16", compile="default", float8=True,
                              expandable_segments=True, ddp_bucket_view=True, ddp_static_graph=True)
    by_knob = {v.knob: v.config for v in ablation.variants(winner, baseline)}
    for knob in GPU_KNOBS:
        assert getattr(by_knob[knob], knob) is False
        assert by_knob[knob].replace(**{knob: True}) == winner
    # reverting what float8 needs takes float8 with it, rather than measuring nothing
    assert by_knob["precision"].precision == "fp32" and not by_knob["precision"].float8
    assert not by_knob["layout"].ddp_static_graph and by_knob["layout"].nprocs == 1


def test_expandable_segments_does_nothing_on_cpu_for_the_ablation():
    baseline = TrialConfig(batch_size=32)
    winner = baseline.replace(expandable_segments=True, threads=2)
    assert "expandable_segments" not in {v.knob for v in ablation.variants(winner, baseline)}


# --- the environment: trials, launch.sh ---------------------------------------------------

def test_the_trial_environment_sets_expandable_segments():
    cfg = TrialConfig(device="cuda", backend="nccl", expandable_segments=True)
    env, warnings = launch.environment(cfg, machine=recorded_machine("h100x1"), base_env={})
    assert env[gpu_knobs.ALLOC_CONF] == "expandable_segments:True" and warnings == []
    env, _ = launch.environment(cfg.replace(expandable_segments=False), machine=recorded_machine("h100x1"),
                                base_env={})
    assert gpu_knobs.ALLOC_CONF not in env


def test_the_users_allocator_options_are_kept_and_expandable_segments_added():
    cfg = TrialConfig(device="cuda", backend="nccl", expandable_segments=True)
    env, warnings = launch.environment(cfg, machine=recorded_machine("h100x1"),
                                       base_env={gpu_knobs.ALLOC_CONF: "max_split_size_mb:128"})
    assert env[gpu_knobs.ALLOC_CONF] == "max_split_size_mb:128,expandable_segments:True"
    assert len(warnings) == 1 and "your options are kept" in warnings[0]
    env, warnings = launch.environment(cfg, machine=recorded_machine("h100x1"),
                                       base_env={gpu_knobs.ALLOC_CONF: "expandable_segments:False"})
    assert env[gpu_knobs.ALLOC_CONF] == "expandable_segments:False"  # theirs stands
    assert "your setting is kept" in warnings[0]


@pytest.mark.parametrize("theirs, expected", [
    (None, "expandable_segments:True"),
    ("max_split_size_mb:128", "max_split_size_mb:128,expandable_segments:True"),
    ("expandable_segments:False", "expandable_segments:False"),
])
def test_launch_sh_merges_the_allocator_options_where_it_runs(tmp_path, theirs, expected):
    cfg = TrialConfig(device="cuda", backend="nccl", expandable_segments=True)
    env, _ = launch.environment(cfg, machine=recorded_machine("h100x1"), base_env={})
    text = outputs.render_launcher(cfg=cfg, env=env)
    [line] = [line for line in text.splitlines() if gpu_knobs.ALLOC_CONF in line]
    shell_env = {"PATH": os.environ["PATH"], **({gpu_knobs.ALLOC_CONF: theirs} if theirs else {})}
    proc = subprocess.run(["bash", "-c", f"set -euo pipefail; {line}; printf %s \"${gpu_knobs.ALLOC_CONF}\""],
                          env=shell_env, capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout == expected, proc.stderr


def test_the_runtime_sets_expandable_segments_for_a_script_started_by_hand():
    env: dict[str, str] = {}
    gpu_knobs.set_expandable_segments({"expandable_segments": True}, env)
    assert env == {gpu_knobs.ALLOC_CONF: "expandable_segments:True"}
    env = {gpu_knobs.ALLOC_CONF: "expandable_segments:True"}
    gpu_knobs.set_expandable_segments({"expandable_segments": True}, env)
    assert env[gpu_knobs.ALLOC_CONF] == "expandable_segments:True"  # not added twice
    env = {}
    gpu_knobs.set_expandable_segments({"expandable_segments": False}, env)
    assert env == {}


# --- float8's conversion in build_model ---------------------------------------------------

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = torch.nn.Linear(32, 64)     # the first Linear: kept in high precision
        self.mid = torch.nn.Linear(64, 64)     # converted
        self.odd = torch.nn.Linear(64, 40)     # 40 is not a multiple of 16: kept
        self.wide = torch.nn.Linear(40, 48)    # 40 again: kept
        self.more = torch.nn.Linear(48, 32)    # converted
        self.head = torch.nn.Linear(32, 10)    # the last Linear: kept

    def forward(self, x):
        for layer in (self.inp, self.mid, self.odd, self.wide, self.more):
            x = torch.relu(layer(x))
        return self.head(x)


@pytest.fixture
def fake_torchao(monkeypatch):
    """A stand-in ``torchao.float8`` that records the layers module_filter_fn accepts (and
    where the model was when converted)."""
    calls: list[dict] = []

    def convert_to_float8_training(module, *, module_filter_fn=None, config=None):
        accepted = [name for name, m in module.named_modules()
                    if isinstance(m, torch.nn.Linear) and module_filter_fn(m, name)]
        calls.append({"accepted": accepted, "device": next(module.parameters()).device.type,
                      "type": type(module).__name__})
        return module

    torchao = types.ModuleType("torchao")
    float8 = types.ModuleType("torchao.float8")
    float8.convert_to_float8_training = convert_to_float8_training  # type: ignore[attr-defined]
    torchao.float8 = float8  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torchao", torchao)
    monkeypatch.setitem(sys.modules, "torchao.float8", float8)
    return calls


class User:
    def build_model(self):
        return Net()


def test_build_model_converts_the_float8_layers_before_ddp_and_compile(fake_torchao, monkeypatch):
    from autotune.runtime.distributed import Distributed
    from autotune.runtime.model import build_model

    for key in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(key, raising=False)
    cfg = {"float8": True, "precision": "bf16", "compile": "off", "device": "cpu"}
    dist = Distributed(cfg)
    built = build_model(User(), cfg, dist, (torch.zeros(2, 32), torch.zeros(2, dtype=torch.long)))
    assert fake_torchao == [{"accepted": ["mid", "more"], "device": "cpu", "type": "Net"}]
    assert isinstance(built.model, Net)
    build_model(User(), {**cfg, "float8": False}, dist, None)
    assert len(fake_torchao) == 1  # off: not converted


# --- in a trial process and in the emitted script (real processes) --------------------------

# Two ranks over gloo with the DDP options and expandable segments forced (on CPU the
# allocator's variable is set and unread, and DDP takes its options over gloo as over NCCL).
FORCED = TrialConfig(nprocs=2, threads=1, batch_size=32, backend="gloo", expandable_segments=True,
                     ddp_bucket_view=True, ddp_static_graph=True)


@pytest.mark.slow
def test_a_trial_applies_the_ddp_options_and_expandable_segments(tmp_path, monkeypatch):
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 usable cores")
    monkeypatch.delenv(gpu_knobs.ALLOC_CONF, raising=False)
    runner = TrialRunner(model_file=TINY, machine=machine_doc(), workdir=tmp_path / "trials",
                         measurement=Measurement(warmup_steps=2, window_s=0.2, windows=2),
                         timeout_s=150, hang_s=60)
    result = runner.run(FORCED, name="gpu-knobs")
    assert result.status == "ok", f"{result.failure}: {result.message}\n{result.log_tail}"
    assert result.setup.process.env[gpu_knobs.ALLOC_CONF] == "expandable_segments:True"
    assert result.facts["ddp"] is True
    assert result.facts["ddp_bucket_view"] is True and result.facts["ddp_static_graph"] is True


@pytest.mark.slow
def test_the_emitted_script_applies_the_ddp_options_and_expandable_segments(tmp_path, no_autotune_env):
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 usable cores")
    env, _ = launch.environment(FORCED, machine=machine_doc(), base_env={})
    out = tmp_path / "out"
    outputs.write_outputs(out, cfg=FORCED, model_file=TINY, env=env, document=run_document(FORCED),
                          description="Train tiny_cnn")
    settings = json.loads((out / outputs.SETTINGS_NAME).read_text())
    assert {k: settings["config"][k] for k in GPU_KNOBS} == {
        "expandable_segments": True, "float8": False, "ddp_bucket_view": True, "ddp_static_graph": True}
    work = tmp_path / "work"
    run_env = {k: v for k, v in no_autotune_env.items() if k != gpu_knobs.ALLOC_CONF}
    run_launch_sh(out, work, run_env, "--max-steps", "3", "--no-checkpoint", "--report", "r.json")
    facts = json.loads((work / "r.json").read_text())["facts"]
    assert facts["env"][gpu_knobs.ALLOC_CONF] == "expandable_segments:True"
    assert facts["ddp"] is True and facts["ddp_bucket_view"] is True and facts["ddp_static_graph"] is True


def test_the_float8_configuration_reaches_train_tuned_json(tmp_path):
    cfg = TrialConfig(device="cuda", backend="nccl", precision="bf16", compile="default", float8=True)
    outputs.write_script(tmp_path, cfg=cfg, model_file=TINY, description="Train tiny_cnn")
    assert json.loads((tmp_path / outputs.SETTINGS_NAME).read_text())["config"]["float8"] is True


# --- the stack files ------------------------------------------------------------------------

def test_the_stack_files_carry_the_gpu_knobs():
    baseline = TrialConfig(device="cuda", backend="nccl", batch_size=32)
    cfg = baseline.replace(nprocs=2, threads=4, precision="bf16", compile="default", float8=True,
                           expandable_segments=True, ddp_bucket_view=True, ddp_static_graph=True)
    env, _ = launch.environment(cfg, machine=recorded_machine("h100x8"), base_env={})
    lightning = stacks.lightning_arguments(cfg, baseline, env)
    assert lightning["strategy"]["gradient_as_bucket_view"] is True
    assert lightning["strategy"]["static_graph"] is True
    assert lightning["environment"][gpu_knobs.ALLOC_CONF] == "expandable_segments:True"
    assert any("convert_to_float8_training" in line for line in lightning["not_expressible"])
    accelerate = stacks.render_accelerate(cfg, baseline, env)
    assert ("accelerator = Accelerator(kwargs_handlers=[DistributedDataParallelKwargs("
            "gradient_as_bucket_view=True, static_graph=True)])") in accelerate
    assert "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in accelerate
    torchrun = stacks.render_torchrun(cfg, env)
    assert "PYTORCH_CUDA_ALLOC_CONF" in torchrun and "*expandable_segments*" in torchrun
    snippet = stacks.render_snippet(cfg, baseline, env)
    assert ("DistributedDataParallel(model, device_ids=[local_rank], gradient_as_bucket_view=True, "
            "static_graph=True)") in snippet
    assert "convert_to_float8_training(model" in snippet
    assert "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in snippet
    plain = stacks.lightning_arguments(baseline.replace(nprocs=2, threads=4), baseline, env)
    assert "static_graph" not in plain["strategy"]  # off: DDPStrategy's defaults


# --- on a GPU (skipped without one) -------------------------------------------------------

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")


def cuda_trial(tmp_path, cfg: TrialConfig, model=TINY):
    runner = TrialRunner(model_file=model, machine={**machine_doc(), "backends": {"nccl": True}},
                         workdir=tmp_path / "trials", measurement=Measurement(warmup_steps=2, window_s=0.2, windows=2),
                         timeout_s=300, hang_s=120, warm=False)
    try:
        result = runner.run(cfg, name="gpu")
    finally:
        runner.shutdown()
    assert result.status == "ok", f"{result.failure}: {result.message}\n{result.log_tail}"
    return result


@pytest.mark.gpu
@pytest.mark.slow
@needs_cuda
def test_on_a_gpu_expandable_segments_reach_the_allocator(tmp_path, monkeypatch):
    monkeypatch.delenv(gpu_knobs.ALLOC_CONF, raising=False)
    base = TrialConfig(device="cuda", backend="nccl", batch_size=16)
    assert cuda_trial(tmp_path / "off", base).facts["cuda_expandable_segments"] is False
    on = cuda_trial(tmp_path / "on", base.replace(expandable_segments=True))
    assert on.setup.process.env[gpu_knobs.ALLOC_CONF] == "expandable_segments:True"
    assert on.facts["cuda_expandable_segments"] is True


def _float8_missing() -> str | None:
    if not CUDA:
        return "needs a CUDA GPU"
    if torch.cuda.get_device_capability() < (8, 9):
        return "float8 needs compute capability 8.9"
    return gpu_space.torchao_float8()


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.skipif(_float8_missing() is not None, reason=str(_float8_missing()))
def test_on_a_gpu_float8_converts_the_model_and_trains(tmp_path):
    cfg = TrialConfig(device="cuda", backend="nccl", batch_size=16, precision="bf16", compile="default",
                      float8=True)
    result = cuda_trial(tmp_path, cfg, MODELS / "blocks_mlp.py")
    assert result.facts["float8_layers"] == [f"blocks.{i}.linear" for i in range(4)]  # not stem, not head
    assert result.losses and all(v == v for v in result.losses)
