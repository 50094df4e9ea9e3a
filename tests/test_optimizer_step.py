"""The optimizer's step implementation (optimizer_step) and the DataLoader's prefetch_factor:
searched where they apply, applied in the trial process and train_tuned.py alike, named in
the stack files, measured by the ablation."""
from __future__ import annotations

import itertools
import json
import subprocess

import pytest
import torch

from autotune.config import TrialConfig
from autotune.document import paths
from autotune.emit import outputs as emit
from autotune.emit import stacks
from autotune.runtime.distributed import Distributed
from autotune.runtime.model import build_model
from autotune.runtime.optimizer_step import optimizer_facts, with_step
from autotune.runtime.session import load_user_module
from autotune.space import build_space
from autotune.task import load_task
from autotune.trials import launch
from autotune.trials.runner import Measurement, TrialRunner
from autotune.verify import ablation
from autotune.verify.precision import describe_checks
from autotune.verify.quality import trades_quality
from autotune.verify.reference import numerics_reference
from autotune.verify.verdict import Verdict

from doubles import recorded_machine
from helpers import MODELS, knob_cnn, machine_doc

GROUPS = MODELS / "groups_optimizer.py"  # SGD, two groups: lr 0.05 + weight decay, lr 0.01


def _groups(optimizer):
    return [{k: v for k, v in g.items() if k not in ("params", "fused", "foreach")} for g in optimizer.param_groups]


# --- applied in the runtime ---------------------------------------------------------------


@pytest.mark.parametrize("step", ["fused", "foreach"])
def test_the_rebuilt_optimizer_keeps_its_class_groups_and_hyperparameters(step):
    model = load_user_module(str(GROUPS)).build_model()
    built = load_user_module(str(GROUPS)).build_optimizer(model.parameters())
    rebuilt = with_step(built, step)
    assert type(rebuilt) is torch.optim.SGD and rebuilt is not built
    assert _groups(rebuilt) == _groups(built)
    assert [g["lr"] for g in rebuilt.param_groups] == [0.05, 0.01]
    assert [[id(p) for p in g["params"]] for g in rebuilt.param_groups] == \
        [[id(p) for p in g["params"]] for g in built.param_groups]
    other = "foreach" if step == "fused" else "fused"
    assert rebuilt.defaults[step] is True and rebuilt.defaults[other] is False
    assert all(g[step] is True and g[other] is False for g in rebuilt.param_groups)
    model(torch.randn(4, 8)).sum().backward()
    rebuilt.step()  # the step runs on CPU (fused SGD since torch 2.4)


def test_fused_and_default_steps_compute_the_same_update_to_rounding():
    torch.manual_seed(0)
    models = [torch.nn.Linear(8, 4) for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    opts = [torch.optim.AdamW(models[0].parameters(), lr=1e-2),
            with_step(torch.optim.AdamW(models[1].parameters(), lr=1e-2), "fused")]
    x = torch.randn(16, 8)
    for _ in range(5):
        for m, o in zip(models, opts):
            o.zero_grad()
            m(x).pow(2).mean().backward()
            o.step()
    assert opts[1].defaults["fused"] is True
    torch.testing.assert_close(models[1].weight, models[0].weight, rtol=1e-5, atol=1e-6)


def test_an_optimizer_class_of_the_users_own_is_left_as_built_and_said_so():
    class MyAdam(torch.optim.Adam):  # a subclass: its constructor need not take the flag
        pass

    built = MyAdam(torch.nn.Linear(2, 2).parameters(), lr=0.1)
    assert with_step(built, "fused") is built
    facts = optimizer_facts(built, "fused")
    assert facts["fused"] is None and "is not a torch.optim class" in facts["not_applied"]
    rms = torch.optim.RMSprop(torch.nn.Linear(2, 2).parameters())
    assert with_step(rms, "fused") is rms
    assert optimizer_facts(rms, "fused")["not_applied"] == "torch.optim.RMSprop takes no fused argument"


def test_build_model_rebuilds_before_scaling_the_learning_rate():
    user = load_user_module(str(GROUPS))
    cfg = {"batch_size": 64, "lr_scaling": "linear", "lr_batch": 16, "optimizer_step": "fused"}
    _, optimizer, _ = build_model(user, cfg, Distributed({}), None)
    assert optimizer.defaults["fused"] is True
    assert [g["lr"] for g in optimizer.param_groups] == [pytest.approx(0.2), pytest.approx(0.04)]
    # IPEX gives the optimizer a step of its own; a hand-edited configuration keeps the user's
    _, plain, _ = build_model(user, {"batch_size": 16}, Distributed({}), None)
    assert plain.defaults["fused"] is None


def test_a_knob_that_cannot_apply_takes_its_default_so_no_configuration_repeats():
    assert TrialConfig(num_workers=0, prefetch_factor=4) == TrialConfig()
    assert TrialConfig(num_workers=2, prefetch_factor=4).prefetch_factor == 4
    assert TrialConfig(ipex=True, optimizer_step="fused").optimizer_step == "default"
    assert TrialConfig(nprocs=2, batch_size=32, sharding="full", optimizer_step="fused").optimizer_step == "default"
    assert TrialConfig(optimizer_step="fused").exact  # rounding only: judged against the fp32 reference
    with pytest.raises(Exception, match="optimizer_step='fast' is not one of default, foreach, fused"):
        TrialConfig(optimizer_step="fast")
    with pytest.raises(Exception, match="prefetch_factor=0 must be at least 1"):
        TrialConfig(num_workers=1, prefetch_factor=0)


# --- the space ----------------------------------------------------------------------------


def test_the_space_searches_the_fused_step_on_cpu_and_on_a_gpu():
    cpu = build_space(machine_doc())
    assert cpu.choices["optimizer_step"] == ["default", "fused"]
    gpu = build_space(recorded_machine("h100x1"), optimizer="torch.optim.sgd.SGD")
    assert gpu.baseline.device == "cuda"
    assert gpu.choices["optimizer_step"] == ["default", "fused"]


@pytest.mark.parametrize("machine, optimizer, values, reason", [
    ("cpu", "user_model_x.MyAdam", None, "user_model_x.MyAdam is not a torch.optim class"),
    ("cpu", "torch.optim.rmsprop.RMSprop", ["default", "foreach"], None),
    ("h100x1", "torch.optim.rmsprop.RMSprop", None, "torch has no fused RMSprop step on cuda"),
    ("h100x1", "torch.optim.adagrad.Adagrad", None, "torch has no fused Adagrad step on cuda"),
    ("h100x1", "torch.optim.lbfgs.LBFGS", None, "neither a fused nor a foreach step"),
])
def test_the_step_is_searched_where_it_applies_and_excluded_with_its_reason(machine, optimizer, values, reason):
    doc = machine_doc() if machine == "cpu" else recorded_machine(machine)
    space = build_space(doc, optimizer=optimizer)
    assert space.choices.get("optimizer_step") == values
    if reason:
        assert reason in space.excluded["optimizer_step"]


def test_an_old_torch_has_no_fused_step_on_cpu():
    doc = machine_doc()
    doc["torch"] = {"version": "2.3.1+cpu"}
    space = build_space(doc)
    assert "optimizer_step" not in space.choices
    assert space.excluded["optimizer_step"] == "torch 2.3.1+cpu has no fused AdamW step on CPU (torch 2.4 added it)"


def test_prefetch_is_searched_only_with_workers_and_counted_once_without():
    space = build_space(machine_doc())
    assert space.choices["prefetch_factor"] == [None, 4, 8] and 0 in space.choices["num_workers"]
    none = build_space(machine_doc(), fixed={"num_workers": 0})
    assert "prefetch_factor" not in none.choices and "workers" in none.excluded["prefetch_factor"]
    # a pinned count of workers keeps it
    assert build_space(machine_doc(), fixed={"num_workers": 2}).choices["prefetch_factor"] == [None, 4, 8]

    # without workers every prefetch value is the same configuration: the grid counts it once
    pins = {"nprocs": 1, "threads": 1, "batch_size": 16, "interop_threads": None, "compile": "off",
            "allocator": "default", "affinity": "none", "backend": "gloo"}
    small = build_space(machine_doc(), fixed=pins)
    searched = {k: v for k, v in small.choices.items() if k not in ("activation_checkpointing", "grad_accum",
                                                                     "sharding")}
    configs = {small.config_from_params(dict(zip(searched, values)))
               for values in itertools.product(*searched.values())}
    assert small.grid_size == len(configs)
    assert len(configs) < len(list(itertools.product(*searched.values())))
    sampled = {k: v[0] for k, v in searched.items()}
    assert (small.config_from_params({**sampled, "num_workers": 0, "prefetch_factor": 8})
            == small.config_from_params({**sampled, "num_workers": 0, "prefetch_factor": None}))


# --- verification -------------------------------------------------------------------------


def test_the_ablation_measures_each_knob_and_reverting_the_workers_reverts_prefetching():
    baseline = TrialConfig(batch_size=16)
    winner = baseline.replace(num_workers=2, persistent_workers=True, prefetch_factor=4, optimizer_step="fused")
    found = {v.knob: v.config for v in ablation.variants(winner, baseline)}
    assert found["optimizer_step"] == winner.replace(optimizer_step="default")
    assert found["prefetch_factor"] == winner.replace(prefetch_factor=None)
    assert found["num_workers"].num_workers == 0 and found["num_workers"].prefetch_factor is None
    steps = ablation.steps_from(winner, baseline)
    assert [s.knobs for s in steps] == [("num_workers",), ("prefetch_factor",), ("optimizer_step",)]
    assert steps[-1].config == winner


def test_the_numerics_check_compares_a_fused_step_with_the_default_steps_reference():
    baseline = TrialConfig(batch_size=16)
    cand = baseline.replace(optimizer_step="fused", batch_size=32)
    assert numerics_reference(baseline, cand).optimizer_step == "default"
    assert not trades_quality(cand)
    verdict = Verdict(config=cand, checks={})
    assert describe_checks(verdict).startswith("fp32, fused optimizer step")


# --- the stack files ----------------------------------------------------------------------


def test_the_stack_files_carry_both_knobs():
    baseline = TrialConfig(batch_size=16)
    cfg = baseline.replace(num_workers=2, persistent_workers=True, prefetch_factor=8, optimizer_step="fused")
    lightning = stacks.lightning_arguments(cfg, baseline, {})
    assert lightning["dataloader"]["prefetch_factor"] == 8
    assert any("fused=True" in line and "build_optimizer()" in line for line in lightning["not_expressible"])
    accelerate = stacks.render_accelerate(cfg, baseline, {})
    assert "prefetch_factor=8" in accelerate
    assert any(line.startswith("# Not expressible here") and "fused=True (foreach=False)" in line
               for line in accelerate.splitlines())
    snippet = stacks.render_snippet(cfg, baseline, {})
    assert "prefetch_factor=8" in snippet and "fused=True)" in snippet
    plain = stacks.lightning_arguments(baseline, baseline, {})
    assert "prefetch_factor" not in plain["dataloader"]
    assert not any("optimizer step" in line for line in plain["not_expressible"])


# --- in the trial process and in train_tuned.py -------------------------------------------


@pytest.mark.slow
def test_the_contract_check_records_the_optimizer_class():
    assert load_task(GROUPS).optimizer == "torch.optim.sgd.SGD"
    assert knob_cnn().optimizer == "torch.optim.adamw.AdamW"  # no build_optimizer: the runtime's


@pytest.mark.slow
def test_the_fused_step_and_prefetch_take_effect_in_the_trial_and_in_train_tuned(tmp_path):
    machine = machine_doc()
    cfg = TrialConfig(threads=1, batch_size=16, num_workers=1, persistent_workers=True, prefetch_factor=4,
                      optimizer_step="fused", lr_scaling="linear", lr_batch=8)
    runner = TrialRunner(model_file=GROUPS, machine=machine, workdir=tmp_path / "trials",
                         measurement=Measurement(warmup_steps=2, window_s=0.2, windows=1), timeout_s=240)
    result = runner.run(cfg, name="t")
    assert result.status == "ok", result.log_tail
    env, _ = launch.environment(cfg, machine=machine, base_env={})
    doc = emit.write_candidate(tmp_path / "out", cfg=cfg, model_file=GROUPS, env=env, description="groups")
    assert json.loads((tmp_path / "out" / "train_tuned.json").read_text())["config"]["optimizer_step"] == "fused"
    report = tmp_path / "report.json"
    proc = subprocess.run(["bash", paths.resolve(doc, tmp_path / "out", "launcher"), "--max-steps", "3",
                           "--no-checkpoint", "--report", str(report)], capture_output=True, text=True,
                          timeout=240, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    for where, facts in (("trial", result.facts), ("train_tuned.py", json.loads(report.read_text())["facts"])):
        opt = facts["optimizer"]
        assert opt["class"] == "SGD" and opt["fused"] is True and opt["foreach"] is False, (where, opt)
        # both groups kept, each learning rate scaled by 16/8 after the rebuild
        assert opt["groups"] == [{"lr": pytest.approx(0.1), "weight_decay": 0.01, "params": 2},
                                 {"lr": pytest.approx(0.02), "weight_decay": 0, "params": 2}], where
        assert opt["not_applied"] is None
        assert facts["loader_prefetch_factor"] == 4, where


@pytest.mark.gpu
def test_a_fused_adamw_steps_on_cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU: the fused CUDA kernels")
    model = torch.nn.Linear(64, 64).cuda()
    optimizer = with_step(torch.optim.AdamW(model.parameters(), lr=1e-3), "fused")
    model(torch.randn(8, 64, device="cuda")).sum().backward()
    optimizer.step()
    assert optimizer.defaults["fused"] is True
    assert optimizer.state[model.weight]["exp_avg"].is_cuda
