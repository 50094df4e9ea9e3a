"""train_tuned.py as a production training script: checkpoints every N steps, at the last
step and on SIGTERM/SIGINT; --resume continues exactly where the run stopped; evaluate()
after each epoch; metrics as JSON lines; a folder copied or moved still runs."""
from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.config import TrialConfig
from autotune.document import paths
from autotune.emit import outputs as emit
from autotune.trials import launch

from helpers import MODELS, emit_outputs, interrupt_after, machine_doc, run_launch_sh, start_launch_sh

# One xdist worker runs this module: its module fixture runs once (README: pytest -n 2).
pytestmark = pytest.mark.xdist_group("train_tuned")

DROPOUT = MODELS / "dropout_cnn.py"
STEPS_PER_EPOCH = 256 // 16


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, no_autotune_env) -> list[float]:
    """The losses of 40 steps (2.5 epochs) trained in one go."""
    root = tmp_path_factory.mktemp("whole")
    emit_outputs(root / "out", TrialConfig(threads=1, batch_size=16))
    run_launch_sh(root / "out", root / "work", no_autotune_env, "--max-steps", "40", "--log-every", "1",
                  "--no-checkpoint", "--report", "r.json")
    return json.loads((root / "work" / "r.json").read_text())["losses"]


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stopped_run_saves_and_resumes_with_the_uninterrupted_losses(
        tmp_path, no_autotune_env, uninterrupted, signum):
    out, work = tmp_path / "out", tmp_path / "work"
    emit_outputs(out, TrialConfig(threads=1, batch_size=16))
    proc = start_launch_sh(out, work, no_autotune_env, "--max-steps", "40", "--log-every", "1", "--report", "a.json")
    stdout, stderr = interrupt_after(proc, "step 9/40", signum)
    assert proc.returncode == 128 + signum, stdout + stderr
    first = json.loads((work / "a.json").read_text())
    stopped_at = first["steps"]
    assert 9 <= stopped_at < 40 and first["stopped_by"] == signum
    assert f"stopped by {signal.Signals(signum).name} after step {stopped_at}" in stdout
    assert (work / "checkpoints" / f"step-{stopped_at:09d}.pt").is_file()
    assert first["losses"] == uninterrupted[:stopped_at]

    # mid-epoch, into the next epochs: the data position, momentum and dropout's draws carry over
    proc = run_launch_sh(out, work, no_autotune_env, "--resume", "--max-steps", "40", "--log-every", "1",
                         "--report", "b.json")
    assert f"resumed from checkpoints/step-{stopped_at:09d}.pt at step {stopped_at}" in proc.stdout
    second = json.loads((work / "b.json").read_text())
    assert second["first_step"] == stopped_at + 1 and second["steps"] == 40
    assert second["losses"] == uninterrupted[stopped_at:]  # bitwise: same seed, same threads


@pytest.mark.slow
def test_two_ranks_stop_after_the_same_step_and_resume(tmp_path, no_autotune_env):
    out, work = tmp_path / "out", tmp_path / "work"
    emit_outputs(out, TrialConfig(nprocs=2, threads=1, batch_size=32))
    whole = tmp_path / "whole"
    run_launch_sh(out, whole, no_autotune_env, "--max-steps", "30", "--log-every", "1", "--no-checkpoint",
                  "--report", "r.json")
    expected = json.loads((whole / "r.json").read_text())["losses"]
    proc = start_launch_sh(out, work, no_autotune_env, "--max-steps", "30", "--log-every", "1", "--report", "a.json")
    stdout, stderr = interrupt_after(proc, "step 3/30", signal.SIGTERM)
    assert proc.returncode == 128 + signal.SIGTERM, stdout + stderr
    stopped_at = json.loads((work / "a.json").read_text())["steps"]
    assert stopped_at % 10 == 0  # the ranks agree on stopping every 10 steps
    run_launch_sh(out, work, no_autotune_env, "--resume", "--max-steps", "30", "--log-every", "1",
                  "--report", "b.json")
    resumed = json.loads((work / "b.json").read_text())["losses"]
    assert resumed == pytest.approx(expected[stopped_at:], rel=1e-6)


@pytest.mark.slow
def test_checkpoints_every_n_steps_and_at_the_end_keeping_the_newest(tmp_path, no_autotune_env):
    import torch

    out, work = tmp_path / "out", tmp_path / "work"
    emit_outputs(out, TrialConfig(threads=1, batch_size=16))
    run_launch_sh(out, work, no_autotune_env, "--max-steps", "23", "--checkpoint-every", "5",
                  "--keep-checkpoints", "2", "--tensorboard", "tb")
    kept = sorted(p.name for p in (work / "checkpoints").glob("step-*.pt"))
    assert kept == [f"step-{20:09d}.pt", f"step-{23:09d}.pt"]
    state = torch.load(work / "checkpoints" / kept[-1], weights_only=False)
    assert state["step"] == 23 and set(state) >= {"model", "optimizer", "rng", "config"}
    lines = [json.loads(line) for line in (work / "checkpoints" / "metrics.jsonl").read_text().splitlines()]
    evaluated = [line for line in lines if "evaluate" in line]
    assert [line["step"] for line in evaluated] == [STEPS_PER_EPOCH]  # after each epoch
    assert 0 <= evaluated[0]["evaluate"] <= 1
    assert [line["step"] for line in lines if "checkpoint" in line] == [5, 10, 15, 20, 23]
    losses = {line["step"]: line["loss"] for line in lines if "loss" in line}
    assert losses

    accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    events = accumulator.EventAccumulator(str(work / "tb"))
    events.Reload()
    assert {e.step: e.value for e in events.Scalars("loss")} == pytest.approx(losses)
    assert [e.step for e in events.Scalars("evaluate")] == [STEPS_PER_EPOCH]


@pytest.mark.slow
def test_resume_without_a_checkpoint_is_a_clear_error(tmp_path, no_autotune_env):
    out, work = tmp_path / "out", tmp_path / "work"
    emit_outputs(out, TrialConfig(threads=1, batch_size=16))
    work.mkdir()
    proc = subprocess.run(["bash", str(out / "launch.sh"), "--resume"], cwd=work, env=no_autotune_env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--resume: no checkpoint in checkpoints" in proc.stderr


@pytest.mark.slow
def test_a_changed_batch_size_prints_the_learning_rate_note(tmp_path, no_autotune_env):
    out = tmp_path / "out"
    emit_outputs(out, TrialConfig(threads=1, batch_size=64), baseline_batch=16)
    proc = run_launch_sh(out, tmp_path / "work", no_autotune_env, "--max-steps", "2", "--no-checkpoint")
    assert "the tuned batch size 64 is 4x your 16, and the learning rate is unchanged" in proc.stderr


# --- a copied or moved output folder ---------------------------------------------------------


def test_best_config_holds_paths_relative_to_its_folder(tmp_path):
    project = tmp_path / "project"
    shutil.copytree(MODELS, project / "models")
    doc = emit_outputs(project / "autotune-out" / "dropout_cnn", TrialConfig(threads=1), project / "models" / "dropout_cnn.py")
    assert doc.model_file == "../../models/dropout_cnn.py"
    assert doc.model_file_tuned == str(project / "models" / "dropout_cnn.py")
    assert doc.outputs == {"config": "best_config.json", "script": "train_tuned.py", "launcher": "launch.sh"}
    text = json.dumps(doc.to_json())
    assert str(sys.executable) not in text
    moved = tmp_path / "moved"
    project.rename(moved)  # the project moved, its output folder with it
    folder = moved / "autotune-out" / "dropout_cnn"
    assert paths.model_file(doc, folder) == moved / "models" / "dropout_cnn.py"
    assert paths.resolve(doc, folder, "launcher") == folder / "launch.sh"
    from autotune.errors import UsageError

    (moved / "models" / "dropout_cnn.py").unlink()
    with pytest.raises(UsageError, match="give it with --model-file"):
        paths.model_file(doc, folder)
    assert paths.model_file(doc, folder, override="x.py") == Path("x.py")


@pytest.mark.slow
def test_a_moved_project_a_copied_folder_and_model_file_all_run(tmp_path, no_autotune_env):
    project = tmp_path / "project"
    (project / "models").mkdir(parents=True)
    shutil.copy(DROPOUT, project / "models" / "dropout_cnn.py")
    emit_outputs(project / "out", TrialConfig(threads=1, batch_size=16), project / "models" / "dropout_cnn.py")
    moved = tmp_path / "moved"
    project.rename(moved)  # nothing is left where it was tuned: the relative path must do
    run_launch_sh(moved / "out", tmp_path / "w1", no_autotune_env, "--max-steps", "2", "--no-checkpoint")

    copy = tmp_path / "elsewhere" / "copy"
    shutil.copytree(moved / "out", copy)  # the folder alone: MODEL_FILE names the model
    proc = subprocess.run(["bash", str(copy / "launch.sh"), "--max-steps", "2", "--no-checkpoint"],
                          cwd=tmp_path, env=no_autotune_env, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0  # neither relative nor tuned path exists
    env = {**no_autotune_env, "MODEL_FILE": str(moved / "models" / "dropout_cnn.py")}
    run_launch_sh(copy, tmp_path / "w2", env, "--max-steps", "2", "--no-checkpoint")


@pytest.mark.slow
def test_launch_sh_from_another_machine_falls_back_to_python3_and_skips_a_missing_allocator(
        tmp_path, no_autotune_env):
    out = tmp_path / "out"
    cfg = TrialConfig(threads=1, batch_size=16, allocator="tcmalloc")
    env, _ = launch.environment(cfg, machine={**machine_doc(), "allocators": {"tcmalloc": "/nowhere/libtc.so"}})
    emit.write_candidate(out, cfg=cfg, model_file=DROPOUT, env=env, description="x")
    (out / "launch.sh").write_text(emit.render_launcher(cfg=cfg, env=env, python="/gone/venv/bin/python"))
    bin_dir = tmp_path / "bin"  # this machine's python3: the test's interpreter
    bin_dir.mkdir()
    (bin_dir / "python3").write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    (bin_dir / "python3").chmod(0o755)
    run_env = {**no_autotune_env, "PATH": f"{bin_dir}:{no_autotune_env['PATH']}"}
    proc = run_launch_sh(out, tmp_path / "work", run_env, "--max-steps", "2", "--no-checkpoint")
    assert "/gone/venv/bin/python is not here; using python3" in proc.stderr
    assert "/nowhere/libtc.so is not on this machine: running without the tuned allocator" in proc.stderr
    assert "step 2/2" in proc.stdout


@pytest.mark.slow
def test_a_signal_to_the_whole_job_with_dataloader_workers_still_saves_and_resumes(
        tmp_path, no_autotune_env):
    """Slurm signals every process of the job step, DataLoader workers included: the
    workers leave SIGTERM to the trainer, which finishes its step and saves."""
    import os

    out, work = tmp_path / "out", tmp_path / "work"
    emit_outputs(out, TrialConfig(threads=1, batch_size=16, num_workers=1, persistent_workers=True))
    # the reference: the same configuration uninterrupted (a DataLoader iterator draws from the
    # random generator when it starts, once with persistent workers, every epoch without)
    run_launch_sh(out, tmp_path / "whole", no_autotune_env, "--max-steps", "40", "--log-every", "1",
                  "--no-checkpoint", "--report", "r.json")
    uninterrupted = json.loads((tmp_path / "whole" / "r.json").read_text())["losses"]
    work.mkdir()
    proc = subprocess.Popen(["bash", str(out / "launch.sh"), "--max-steps", "40", "--log-every", "1",
                             "--report", "a.json"], cwd=work, env=no_autotune_env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("step 9/40"):
            os.killpg(proc.pid, signal.SIGTERM)  # every process of the job, as a scheduler does
            break
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err[-2000:]
    stopped_at = json.loads((work / "a.json").read_text())["steps"]
    assert (work / "checkpoints" / f"step-{stopped_at:09d}.pt").is_file()
    run_launch_sh(out, work, no_autotune_env, "--resume", "--max-steps", "40", "--log-every", "1",
                  "--report", "b.json")
    assert json.loads((work / "b.json").read_text())["losses"] == uninterrupted[stopped_at:]


@pytest.mark.slow
def test_a_run_started_ahead_sets_up_then_trains_only_once_let_go(tmp_path):
    """--start-after, as verification's standalone pairs use it (trials.script_run): the run
    sets up and waits, training nothing, until it is let go; a run never let go is ended
    with everything it started."""
    import contextlib
    import time

    import psutil

    from autotune.trials.runner import TRIAL_DIR_VARIABLE, start_launcher

    out = tmp_path / "out"
    emit_outputs(out, TrialConfig(threads=1, batch_size=16))
    held = start_launcher(out / "launch.sh", steps=6, workdir=tmp_path / "held", timeout_s=120,
                          cwd=tmp_path, hold=True)
    time.sleep(8.0)  # imports, build_dataset, build_model: done or under way, then it waits
    assert held.proc.poll() is None and not held.report.exists()
    assert "step " not in held.log.read_text(), "it trained before it was let go"
    report = held.finish()
    assert report.samples_per_s and report.samples_per_s > 0
    assert "step 6/6" in held.log.read_text()

    never = start_launcher(out / "launch.sh", steps=6, workdir=tmp_path / "never", timeout_s=120,
                           cwd=tmp_path, hold=True)
    time.sleep(2.0)
    never.cancel()
    assert never.proc.poll() is not None and not never.report.exists()

    def of_never() -> list[psutil.Process]:
        found = []
        for p in psutil.process_iter():
            with contextlib.suppress(psutil.Error):
                if p.environ().get(TRIAL_DIR_VARIABLE) == str((tmp_path / "never").absolute()):
                    found.append(p)
        return found

    assert not of_never()
