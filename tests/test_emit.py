"""The generated script: train_tuned.py and launch.sh reproduce the tuned
configuration, train for real, and need torch and the model file, never autotune."""
from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.config import TrialConfig
from autotune.document.run import RunDocument
from autotune.emit import outputs as emit
from autotune.trials import launch

from helpers import MODELS, machine_doc, run_document, run_launch_sh

TINY = MODELS / "tiny_cnn.py"


def write(out_dir: Path, cfg: TrialConfig, model_file: Path = TINY) -> RunDocument:
    env, warnings = launch.environment(cfg, machine=machine_doc())
    assert warnings == []
    return emit.write_outputs(out_dir, cfg=cfg, model_file=model_file, env=env,
                              document=run_document(cfg), description="Train tiny_cnn")


def assert_learns(losses: list[float]) -> None:
    assert len(losses) == 40
    assert statistics.mean(losses[-10:]) < statistics.mean(losses[:10]), losses


# --- fast checks of the files themselves ----------------------------------------------------


def test_outputs_are_written(tmp_path):
    cfg = TrialConfig(nprocs=2, threads=1, batch_size=32)
    doc = write(tmp_path / "out", cfg)
    out = tmp_path / "out"
    stored = json.loads((out / "best_config.json").read_text())
    assert stored == json.loads(json.dumps(doc.to_json()))
    assert stored["schema"] == 2 and stored["config"] == cfg.to_dict()
    assert "2 ranks" in stored["launch"]
    assert os.access(out / "launch.sh", os.X_OK)
    script = (out / "train_tuned.py").read_text()
    assert "import autotune" not in script and "from autotune" not in script
    compile(script, "train_tuned.py", "exec")
    launcher = (out / "launch.sh").read_text()
    # one node (the default): the script starts its own ranks; torchrun only for several nodes
    one_node = launcher[launcher.index('if [ "$nnodes" = 1 ]; then'):]
    one_node = one_node[:one_node.index("\nfi\n")]
    assert "export TUNED_NPROCS=2" in one_node and 'exec "$PYTHON" "$here/train_tuned.py" "$@"' in one_node
    assert "torch.distributed.run" not in one_node


ODD = '__CONFIG__ "q" $(touch PWNED) back\\slash'


def test_odd_names_reach_the_script_as_data(tmp_path):
    """The configuration is data (train_tuned.json), never code: quotes, a $(...),
    backslashes or a placeholder's name in the model path or the description are kept as
    they are, and the script is the template whatever they hold."""
    model = tmp_path / ODD / "model.py"
    description = f'Train q""""\\N{{oops}} {ODD}'
    emit.write_script(tmp_path / "out", cfg=TrialConfig(threads=1, batch_size=16), model_file=model,
                      description=description)
    settings = json.loads((tmp_path / "out" / emit.SETTINGS_NAME).read_text())
    assert settings["model_file_tuned"] == str(model) and settings["description"] == description
    assert settings["model_file"] == os.path.join("..", ODD, "model.py")
    assert (tmp_path / "out" / emit.SCRIPT_NAME).read_bytes() == emit.SCRIPT_TEMPLATE.read_bytes()


@pytest.mark.slow
def test_a_script_for_odd_names_runs(tmp_path, no_autotune_env):
    odd = tmp_path / ODD
    odd.mkdir()
    shutil.copy(TINY, odd / "model.py")
    description = f'Train q""""\\N{{oops}} {ODD}'
    cfg = TrialConfig(threads=1, batch_size=16)
    env, _ = launch.environment(cfg, machine=machine_doc())
    out = tmp_path / "out"
    emit.write_outputs(out, cfg=cfg, model_file=odd / "model.py", env=env, document=run_document(cfg),
                       description=description)
    work = tmp_path / "work"
    shown = run_launch_sh(out, work, no_autotune_env, "--help").stdout
    assert description in " ".join(shown.split())  # argparse rewraps the description
    run_launch_sh(out, work, no_autotune_env, "--max-steps", "2", "--no-checkpoint", "--report", "r.json")
    assert json.loads((work / "r.json").read_text())["steps"] == 2
    assert not list(tmp_path.rglob("PWNED"))


def test_launcher_keeps_the_users_variables_and_passes_arguments_through(tmp_path):
    """launch.sh with a stand-in python: what it exports, and the argv it hands over."""
    out = tmp_path / "out"
    write(out, TrialConfig(threads=1, batch_size=16))
    fake = tmp_path / "fake-python"
    fake.write_text('#!/bin/sh\necho "OMP=$OMP_NUM_THREADS"\nfor a in "$@"; do echo "ARG=$a"; done\n')
    fake.chmod(0o755)
    env = {**os.environ, "PYTHON": str(fake)}
    env.pop("OMP_NUM_THREADS", None)
    proc = subprocess.run(["bash", str(out / "launch.sh"), "--report", "a b $c.json"],
                          env=env, capture_output=True, text=True, check=True)
    assert proc.stdout.splitlines() == [
        "OMP=1", f"ARG={out / 'train_tuned.py'}", "ARG=--report", "ARG=a b $c.json"]

    env["OMP_NUM_THREADS"] = "7"
    proc = subprocess.run(["bash", str(out / "launch.sh")], env=env,
                          capture_output=True, text=True, check=True)
    assert proc.stdout.splitlines()[0] == "OMP=7"  # the user's value is kept ...
    assert "keeping your OMP_NUM_THREADS=7" in proc.stderr  # ... and said so


def test_launch_sh_sets_autotunes_own_variables_whatever_the_shell_holds(tmp_path):
    """TUNED_* are autotune's protocol, not the user's settings: one left in the shell (by
    another configuration's launch.sh) is never kept."""
    fake = tmp_path / "fake-python"
    fake.write_text('#!/bin/sh\necho "NPROCS=${TUNED_NPROCS-unset} CPUS=${TUNED_CPUS_PER_RANK-unset}"\n')
    fake.chmod(0o755)
    env = {**os.environ, "PYTHON": str(fake), "TUNED_NPROCS": "4", "TUNED_CPUS_PER_RANK": "0;1"}
    one, two = tmp_path / "one", tmp_path / "two"
    write(one, TrialConfig(threads=1, batch_size=16))
    write(two, TrialConfig(nprocs=2, threads=1, batch_size=16))
    for out, expected in ((one, "NPROCS=unset CPUS=unset"), (two, "NPROCS=2 CPUS=unset")):
        proc = subprocess.run(["bash", str(out / "launch.sh")], env=env,
                              capture_output=True, text=True, check=True)
        assert proc.stdout.strip() == expected and "TUNED" not in proc.stderr


# --- the script trains ----------------------------------------------------------------------


@pytest.mark.slow
def test_script_trains_one_process_without_autotune(tmp_path, no_autotune_env):
    out = tmp_path / "out"
    cfg = TrialConfig(threads=1, batch_size=16)
    write(out, cfg)
    script = (out / "train_tuned.py").read_text()
    assert "import autotune" not in script and "from autotune" not in script
    work = tmp_path / "elsewhere"
    run_launch_sh(out, work, no_autotune_env, "--max-steps", "40", "--no-checkpoint",
                  "--report", "r.json")
    report = json.loads((work / "r.json").read_text())
    facts = report["facts"]  # what the knobs did inside the script's own process
    assert facts["world"] == 1 and facts["ddp"] is False
    assert facts["threads"] == 1  # launch.sh / the script applied the threads knob
    assert facts["env"]["OMP_NUM_THREADS"] == "1"
    assert facts["per_rank_batch"] == 16
    assert report["steps"] == 40 and report["samples_per_s"] > 0
    assert_learns(report["losses"])
    assert not (work / "checkpoints").exists()


@pytest.mark.slow
def test_script_starts_and_trains_two_ranks(tmp_path, no_autotune_env):
    out = tmp_path / "out"
    write(out, TrialConfig(nprocs=2, threads=1, batch_size=32, backend="gloo"))
    work = tmp_path / "elsewhere"
    run_launch_sh(out, work, no_autotune_env, "--max-steps", "40", "--no-checkpoint",
                  "--report", "r.json")
    report = json.loads((work / "r.json").read_text())
    facts = report["facts"]
    assert facts["world"] == 2 and facts["backend"] == "gloo" and facts["ddp"] is True
    assert facts["threads"] == 1
    assert facts["per_rank_batch"] == 16  # the global batch of 32 split over 2 ranks
    assert report["steps"] == 40
    assert_learns(report["losses"])


@pytest.mark.slow
def test_two_ranks_leave_cleanly_with_their_checkpoint_and_report(tmp_path, no_autotune_env):
    """Ranks skip the interpreter teardown (a gloo abort there failed a finished job):
    what they wrote before leaving must be complete, and the launcher must exit 0."""
    import torch

    out = tmp_path / "out"
    write(out, TrialConfig(nprocs=2, threads=1, batch_size=64, backend="gloo"))
    work = tmp_path / "elsewhere"
    proc = run_launch_sh(out, work, no_autotune_env, "--epochs", "1", "--report", "r.json")
    assert proc.returncode == 0
    assert "saved checkpoints/step-000000008.pt" in proc.stdout and "samples/s" in proc.stdout
    assert json.loads((work / "r.json").read_text())["steps"] == 512 // 64
    assert torch.load(work / "checkpoints" / "step-000000008.pt", weights_only=False)["step"] == 8


@pytest.mark.slow
def test_one_epoch_saves_a_loadable_checkpoint(tmp_path, no_autotune_env):
    import torch

    out = tmp_path / "out"
    cfg = TrialConfig(threads=1, batch_size=64)
    write(out, cfg)
    work = tmp_path / "elsewhere"
    proc = run_launch_sh(out, work, no_autotune_env, "--epochs", "1", "--report", "r.json")
    report = json.loads((work / "r.json").read_text())
    assert report["steps"] == 512 // 64  # one pass over the tiny dataset
    path = work / "checkpoints" / "step-000000008.pt"
    assert path.is_file(), proc.stdout
    assert sorted(p.name for p in (work / "checkpoints").glob("*.pt")) == [path.name]
    checkpoint = torch.load(path, weights_only=False)
    assert checkpoint["step"] == 8
    assert checkpoint["config"] == cfg.to_dict()
    sys.path.insert(0, str(MODELS))
    try:
        import tiny_cnn
    finally:
        sys.path.remove(str(MODELS))
    model = tiny_cnn.build_model()
    model.load_state_dict(checkpoint["model"])  # every key and shape matches
    trained = checkpoint["model"]["classifier.1.weight"]
    assert not torch.equal(trained, model.__class__().state_dict()["classifier.1.weight"])


@pytest.mark.slow
def test_paths_with_spaces_and_dollar_signs(tmp_path, no_autotune_env):
    odd = tmp_path / "my $HOME models" / "it's here"
    odd.mkdir(parents=True)
    model = odd / "tiny cnn.py"
    shutil.copy(TINY, model)
    out = tmp_path / "out $dir (1)"
    write(out, TrialConfig(threads=1, batch_size=16), model_file=model)
    work = tmp_path / "work $x"
    run_launch_sh(out, work, no_autotune_env, "--max-steps", "3", "--no-checkpoint",
                  "--report", "report $1.json")
    report = json.loads((work / "report $1.json").read_text())
    assert report["steps"] == 3 and len(report["losses"]) == 3


@pytest.mark.slow
def test_an_interpreter_path_with_spaces_and_dollars_is_quoted(tmp_path, no_autotune_env):
    """An environment under '/opt/my envs/' made exec fail; a $(...) in the path ran."""
    odd = tmp_path / "my envs" / "$(touch PWNED)"
    odd.mkdir(parents=True)
    (odd / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')  # the venv's own
    (odd / "python").chmod(0o755)
    cfg = TrialConfig(threads=1, batch_size=16)
    env, _ = launch.environment(cfg, machine=machine_doc())
    out = tmp_path / "out"
    write(out, cfg)  # train_tuned.py, and a launch.sh replaced here
    (out / "launch.sh").write_text(emit.render_launcher(cfg=cfg, env=env, python=str(odd / "python")))
    work = tmp_path / "work"
    env_run = {k: v for k, v in no_autotune_env.items() if k != "PYTHON"}
    run_launch_sh(out, work, env_run, "--max-steps", "3", "--no-checkpoint", "--report", "r.json")
    assert json.loads((work / "r.json").read_text())["steps"] >= 3
    assert not list(tmp_path.rglob("PWNED")) and not (work / "PWNED").exists()


def test_a_crash_while_writing_leaves_the_previous_outputs_whole(tmp_path, monkeypatch):
    cfg = TrialConfig(threads=1, batch_size=16)
    write(tmp_path, cfg)
    before = {name: (tmp_path / name).read_text()
              for name in ("train_tuned.py", "best_config.json", "launch.sh")}
    real = Path.write_text

    def dies_halfway(self, text, *args, **kwargs):  # the disk fills up mid-write
        real(self, text[: len(text) // 2], *args, **kwargs)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Path, "write_text", dies_halfway)
    with pytest.raises(OSError):
        write(tmp_path, cfg.replace(batch_size=32))
    monkeypatch.undo()
    for name, text in before.items():
        assert (tmp_path / name).read_text() == text, f"{name} was left half-written"
