"""--scale-lr: a tuned batch size unlike the user's scales the learning rate (linear: by the
batches' ratio, sqrt: by its square root) in every configuration, applied in one place, the
runtime's build_model, so trials, verification and train_tuned.py all train with it; the
script's note, the stack files and best_config.json say so."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

import autotune
from autotune import pipeline, schemas
from autotune.cli import main as cli_main
from autotune.config import TrialConfig
from autotune.emit import stacks
from autotune.errors import UsageError
from autotune.options import RunOptions, parse_fixes, parse_scale_lr
from autotune.runtime.distributed import Distributed
from autotune.runtime.knobs import DEFAULT_OPTIMIZER, LrScaling
from autotune.runtime.main import batch_note
from autotune.runtime.model import build_model, config_lr_factor
from autotune.runtime.session import load_user_module
from autotune.search.task_space import build_task_space
from autotune.sections import SearchOptions
from autotune.space import build_space
from autotune.verify import ablation

from doubles import StandInRunner, recorded_machine, tune_stand_in
from helpers import MODELS, emit_outputs, knob_cnn, run_launch_sh

BLOCKS = MODELS / "blocks_mlp.py"  # AdamW, lr=1e-2


# --- the factor -------------------------------------------------------------------------------


@pytest.mark.parametrize(("rule", "batch", "lr_batch", "factor"), [
    ("none", 128, 32, 1.0), ("linear", 128, 32, 4.0), ("sqrt", 128, 32, 2.0),
    ("linear", 16, 32, 0.5), ("linear", 32, 32, 1.0), ("linear", 128, None, 1.0), ("sqrt", 8, 32, 0.5),
])
def test_the_factor_follows_the_batch_from_the_users(rule, batch, lr_batch, factor):
    cfg = TrialConfig(batch_size=batch, lr_scaling=rule, lr_batch=lr_batch)
    assert cfg.lr_factor == pytest.approx(factor)


def test_a_configuration_without_the_rule_loads_and_keeps_the_learning_rate():
    old = TrialConfig(batch_size=64).to_dict()
    del old["lr_scaling"], old["lr_batch"]  # a best_config.json written before --scale-lr
    cfg = TrialConfig.from_dict(old)
    assert (cfg.lr_scaling, cfg.lr_batch, cfg.lr_factor) == ("none", None, 1.0)


def test_a_bad_rule_or_batch_is_refused_naming_the_choices():
    with pytest.raises(UsageError, match=r"lr_scaling='cubic' is not one of none, linear, sqrt"):
        TrialConfig(lr_scaling="cubic", lr_batch=32)
    with pytest.raises(UsageError, match=r"lr_batch=0 must be at least 1"):
        TrialConfig(lr_scaling="linear", lr_batch=0)


# --- the option ---------------------------------------------------------------------------------


def test_the_option_takes_the_vocabulary_and_refuses_anything_else():
    assert RunOptions().scale_lr == "none"
    assert RunOptions(scale_lr="Linear").scale_lr == "linear"
    assert RunOptions(scale_lr=LrScaling.SQRT).scale_lr == "sqrt"
    assert parse_scale_lr("sqrt") == "sqrt"
    with pytest.raises(UsageError, match=r"--scale-lr 'cubic': expected one of none, linear, sqrt"):
        RunOptions(scale_lr="cubic")


def test_the_cli_and_tune_refuse_a_bad_rule_before_anything_runs(capsys):
    assert cli_main(["run", str(MODELS / "tiny_cnn.py"), "--scale-lr", "cubic"]) != 0
    assert "--scale-lr 'cubic': expected one of none, linear, sqrt" in capsys.readouterr().err
    with pytest.raises(UsageError, match="--scale-lr 'cubic'"):
        autotune.tune(MODELS / "tiny_cnn.py", scale_lr="cubic")


def test_the_cli_passes_the_rule_to_the_run(monkeypatch, tmp_path):
    seen = {}

    def fake_tune(model_file, *, out, options, reporter, force, script_args=()):
        seen["options"] = options
        raise SystemExit(0)

    monkeypatch.setattr(pipeline, "tune", fake_tune)
    with pytest.raises(SystemExit):
        cli_main(["run", str(MODELS / "tiny_cnn.py"), "--out", str(tmp_path / "o"), "--scale-lr", "sqrt"])
    assert seen["options"].scale_lr == "sqrt"


def test_fix_refuses_the_rule_and_points_to_the_option():
    for item in ("lr_scaling=linear", "lr_batch=64"):
        with pytest.raises(UsageError, match=r"--fix lr_.*not a knob; give --scale-lr \{none,linear,sqrt\}"):
            parse_fixes([item])


# --- every configuration carries it ---------------------------------------------------------


def test_every_configuration_of_the_space_carries_the_rule_and_its_own_factor():
    space = build_space(recorded_machine("avx2_epyc"), baseline_batch=32, scale_lr="linear")
    assert (space.baseline.lr_scaling, space.baseline.lr_batch, space.baseline.lr_factor) == ("linear", 32, 1.0)
    params = {name: values[0] for name, values in space.choices.items()}
    for batch in space.choices["batch_size"]:
        cfg = space.config_from_params({**params, "batch_size": batch})
        assert (cfg.lr_scaling, cfg.lr_batch) == ("linear", 32)
        assert cfg.lr_factor == pytest.approx(batch / 32)
    plain = build_space(recorded_machine("avx2_epyc"), baseline_batch=32)
    assert plain.baseline == TrialConfig(batch_size=32)  # without the rule, the configurations of before
    assert plain.config_from_params({**params, "batch_size": 128}).lr_factor == 1.0


def test_the_run_builds_its_space_with_the_option():
    task = SimpleNamespace(batch_size=24, dataset_len=None, image_inputs=False, batchnorm_layers=(), blocks=(),
                           has_evaluate=False, has_training_step=False, optimizer=DEFAULT_OPTIMIZER,
                           convolutions=False, script=None)
    space = build_task_space(task, recorded_machine("avx2_epyc"), SearchOptions.of(RunOptions(scale_lr="sqrt"), task=task))
    assert (space.baseline.lr_scaling, space.baseline.lr_batch) == ("sqrt", 24)


def test_the_ablation_measures_no_learning_rate_and_reverting_the_batch_reverts_the_factor():
    baseline = TrialConfig(batch_size=32, lr_scaling="linear", lr_batch=32)
    winner = baseline.replace(batch_size=128, channels_last=True)
    found = {v.knob: v.config for v in ablation.variants(winner, baseline)}
    assert set(found) == {"batch_size", "channels_last"}
    assert found["batch_size"].lr_factor == 1.0 and found["channels_last"].lr_factor == 4.0


def test_a_stand_in_run_writes_the_rule_into_every_configuration_it_records(tmp_path):
    task = knob_cnn()
    doc = tune_stand_in(task, tmp_path, StandInRunner(recorded_machine("avx2_epyc")), scale_lr="linear")
    assert schemas.problem(doc, "best_config") is None
    for cfg in (doc["config"], doc["baseline"]["config"]):
        assert (cfg["lr_scaling"], cfg["lr_batch"]) == ("linear", task.batch_size)
    assert not any(k["knob"].startswith("lr") for k in (doc.get("ablation") or {}).get("knobs", []))
    # its trials were measured under the rule: the study is not resumed under another one
    with pytest.raises(UsageError, match=r"searched other values of lr_scaling \(lr_scaling: \['linear'\] then, None now\)"):
        tune_stand_in(task, tmp_path, StandInRunner(recorded_machine("avx2_epyc")))


# --- applied in the runtime ------------------------------------------------------------------


def test_build_model_scales_every_group_and_keeps_a_tensor_a_tensor():
    user = load_user_module(str(BLOCKS))
    dist = Distributed({})
    _, optimizer, _ = build_model(user, {"batch_size": 64, "lr_scaling": "linear", "lr_batch": 16}, dist, None)
    assert [g["lr"] for g in optimizer.param_groups] == [pytest.approx(0.04)]
    _, optimizer, _ = build_model(user, {"batch_size": 64, "lr_scaling": "sqrt", "lr_batch": 16}, dist, None)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.02)
    _, optimizer, _ = build_model(user, {"batch_size": 64, "lr_batch": 16}, dist, None)
    assert optimizer.param_groups[0]["lr"] == 1e-2  # none: the user's, untouched

    shared = torch.tensor(0.1)

    class TensorLr:  # two groups, one with a learning rate of its own, one sharing a tensor
        build_model = user.build_model

        @staticmethod
        def build_optimizer(params):
            params = list(params)
            return torch.optim.SGD([{"params": params[:2], "lr": shared},
                                    {"params": params[2:4], "lr": shared},
                                    {"params": params[4:], "lr": 0.3}], lr=shared)

    _, optimizer, _ = build_model(TensorLr, {"batch_size": 64, "lr_scaling": "linear", "lr_batch": 16}, dist, None)
    lrs = [g["lr"] for g in optimizer.param_groups]
    assert isinstance(lrs[0], torch.Tensor) and lrs[0] is shared
    assert float(lrs[0]) == pytest.approx(0.4) and float(lrs[1]) == pytest.approx(0.4)  # once, not twice
    assert lrs[2] == pytest.approx(1.2)


def test_on_several_nodes_the_factor_follows_the_global_batch():
    cfg = {"batch_size": 64, "lr_scaling": "linear", "lr_batch": 16}
    assert config_lr_factor(cfg, nodes=1) == 4.0 and config_lr_factor(cfg, nodes=2) == 8.0
    assert config_lr_factor({**cfg, "lr_scaling": "sqrt"}, nodes=4) == pytest.approx(4.0)


# --- what the user reads ------------------------------------------------------------------


def test_the_note_says_the_learning_rate_was_scaled_instead_of_suggesting_it():
    note = batch_note(64, baseline_batch=16, lr_scaling="linear", lr_factor=4.0, lr=0.2)
    assert "scaled by 4 (--scale-lr linear): from 0.05 to 0.2 for the first parameter group" in note
    assert "suggests" not in note
    # without the rule, the note is today's
    assert batch_note(64, baseline_batch=16, lr_scaling="none") == batch_note(64, baseline_batch=16)
    assert "suggests multiplying it by 4" in batch_note(64, baseline_batch=16)


def test_the_users_own_launchers_say_to_multiply_the_learning_rate():
    baseline = TrialConfig(batch_size=16, lr_scaling="linear", lr_batch=16)
    cfg = baseline.replace(batch_size=64)
    accelerate = stacks.render_accelerate(cfg, baseline, {})
    assert "multiply every parameter group's lr by 4 (64/16" in accelerate
    assert "group['lr'] *= 4" in accelerate
    lightning = stacks.lightning_arguments(cfg, baseline, {})
    assert any("multiply every parameter group's lr by 4" in line for line in lightning["not_expressible"])
    assert "    group['lr'] *= 4" in stacks.render_snippet(cfg, baseline, {})
    sqrt = cfg.replace(lr_scaling="sqrt")
    assert "by 2 (sqrt(64/16)" in stacks.render_accelerate(sqrt, baseline, {})
    for same in (baseline, cfg.replace(lr_scaling="none")):  # factor 1: nothing to say
        assert "learning rate" not in " ".join(stacks.lightning_arguments(same, baseline, {})["not_expressible"])
        assert "group['lr']" not in stacks.render_snippet(same, baseline, {})


@pytest.mark.slow
def test_train_tuned_trains_at_four_times_the_batch_with_four_times_the_learning_rate(tmp_path, no_autotune_env):
    """Two ranks holding a sharded model: the optimizer is built over the shards, and its
    learning rate scaled all the same."""
    cfg = TrialConfig(nprocs=2, threads=1, batch_size=64, sharding="full", lr_scaling="linear", lr_batch=16)
    out, work = tmp_path / "out", tmp_path / "work"
    emit_outputs(out, cfg, BLOCKS, baseline_batch=16)  # AdamW, lr=1e-2
    proc = run_launch_sh(out, work, no_autotune_env, "--max-steps", "2", "--no-checkpoint", "--report", "r.json")
    facts = json.loads((work / "r.json").read_text())["facts"]
    assert facts["sharded"] and facts["lr_factor"] == 4.0 and facts["lr"] == pytest.approx(0.04)
    assert "learning rate was scaled by 4 (--scale-lr linear): from 0.01 to 0.04" in proc.stderr
    assert json.loads((out / "best_config.json").read_text())["config"]["lr_scaling"] == "linear"
