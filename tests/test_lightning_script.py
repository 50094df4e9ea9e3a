"""The Lightning script as a way in: recognised by its source, checked by running it up to its
Trainer's first steps inside ``fit``, each fault named with the fix and nothing left running;
its configurations as Trainer and DataLoader arguments and a batch attribute; one real run of
a script with a DataModule that holds ``batch_size``, tuned and verified, whose emitted
arguments are read back from inside the Trainer and the DataLoader of run_tuned.py and
launch.sh."""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from autotune.config import TrialConfig
from autotune.emit import script_outputs
from autotune.search.task_space import script_space
from autotune.space import build_space
from autotune.task import load_task
from autotune.task.lightning_script import KIND, LightningFacts
from autotune.task.load import recognise

from doubles import recorded_machine
from helpers import MODELS, contract_error, emitted_report, left_running, one_screen, two_rank_trial

SCRIPTS = MODELS / "lightning"
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

pytestmark = pytest.mark.xdist_group("lightning_script")


def facts(**changes) -> LightningFacts:
    loader = {"batch_size": 16, "num_workers": 0, "pin_memory": False, "persistent_workers": False,
              "prefetch_factor": None, "drop_last": False, "shuffle": True}
    base = LightningFacts(trainer_values={"max_epochs": 3, "accelerator": "cpu"}, loader_values=loader,
                          batch_holder="datamodule.batch_size", trainer_line=12, loader_line=30, fit_line=14,
                          has_eval=True, metric="val_acc", greater_is_better=True, seed=0)
    return dataclasses.replace(base, **changes)


# --- without processes

def test_a_lightning_script_is_recognised_by_its_source(tmp_path):
    for path in (EXAMPLES / "lightning_datamodule.py", EXAMPLES / "lightning_dataloaders.py",
                 SCRIPTS / "datamodule.py"):
        assert recognise(path, path.read_text()) == KIND, path
    # a model file that happens to use Lightning's utilities is still a model file
    assert recognise(tmp_path / "m.py", "import lightning\ndef build_model():\n    pass\ntrainer.fit(m)\n") == "model_file"
    # importing lightning without fitting is not a script autotune can tune
    assert recognise(tmp_path / "x.py", "import lightning\nprint(1)\n") is None


def test_the_baseline_overrides_nothing_and_each_knob_its_own_argument():
    script = facts()
    base = script.baseline(TrialConfig())
    assert (base.batch_size, base.num_workers, base.precision, base.compile) == (16, 0, "fp32", "off")
    assert script.overrides(base) == {}
    assert script.overrides(base.replace(precision="bf16")) == {"trainer": {"precision": "bf16-mixed"}}
    assert script.overrides(base.replace(batch_size=64)) == {"batch_size": 64}
    assert script.overrides(base.replace(num_workers=2, persistent_workers=True, prefetch_factor=4)) == {
        "loader": {"num_workers": 2, "persistent_workers": True, "prefetch_factor": 4}}
    assert script.overrides(base.replace(compile="default")) == {"compile": "default"}
    assert script.overrides(base.replace(batch_size=32, grad_accum=2)) == {"trainer": {"accumulate_grad_batches": 2}}
    # a script written for several devices runs as the one process autotune measured
    assert facts(trainer_values={"devices": 4}).overrides(base) == {"trainer": {"devices": 1}}
    # two ranks: Lightning's DDP on the ranks autotune starts, each with half the global batch
    assert script.overrides(base.replace(nprocs=2, threads=1, batch_size=32)) == {
        "trainer": {"devices": 2, "strategy": "ddp"}}
    assert script.overrides(base.replace(nprocs=2, threads=1)) == {
        "trainer": {"devices": 2, "strategy": "ddp"}, "batch_size": 8}
    # a script written with bf16-mixed has it as its baseline; an fp32 candidate turns it off
    written = facts(trainer_values={"precision": "bf16-mixed"})
    assert written.baseline(TrialConfig()).precision == "bf16"
    assert written.overrides(written.baseline(TrialConfig()).replace(precision="fp32")) == {
        "trainer": {"precision": "32-true"}}
    said = script.said({"trainer": {"precision": "bf16-mixed"}, "loader": {"num_workers": 2}, "batch_size": 64,
                        "compile": "default"})
    assert said == ["Trainer (line 12): precision='bf16-mixed'", "training DataLoader (line 30): num_workers=2",
                    "datamodule.batch_size = 64", "trainer.fit(torch.compile(model), ...) (line 14), after "
                    "model.log = torch.compiler.disable(model.log) (dynamo cannot trace Lightning's log)"]


def test_the_space_names_what_a_lightning_script_cannot_take():
    machine = recorded_machine("avx2_epyc")
    space = script_space(build_space(machine, baseline_batch=16), facts())
    assert "batch_size" in space.choices and "configure_optimizers" in space.excluded["optimizer_step"]
    assert "2x1" in space.choices["layout"]  # its ranks are searched (the quality check judges them)
    assert not any(k.startswith("layout=") for k in space.excluded)
    # without a validation loop nothing could judge them: one process, and the fix named
    unjudged = script_space(build_space(machine, baseline_batch=16), facts(has_eval=False))
    assert all(layout.startswith("1x") for layout in unjudged.choices["layout"])
    assert any(k.startswith("layout=") and "give its LightningModule a validation_step" in v
               for k, v in unjudged.excluded.items())
    # no batch_size attribute: the batch is kept, and the reason says what to add
    nowhere = script_space(build_space(machine, baseline_batch=16), facts(batch_holder=None))
    assert "batch_size" not in nowhere.choices and "add one (self.batch_size = 32" in nowhere.excluded["batch_size"]
    assert nowhere.baseline.batch_size == 16
    # an iterable of its own: no DataLoader knobs, with the reason
    iterable = script_space(build_space(machine, baseline_batch=16), facts(loader_kind="Batches", loader_values={}))
    assert "num_workers" not in iterable.choices
    assert "trains on a Batches, not a torch DataLoader" in iterable.excluded["num_workers"]


def test_the_tuned_arguments_are_said_as_lines_of_the_script():
    script = facts()
    cfg = script.baseline(TrialConfig()).replace(precision="bf16", num_workers=1)
    text = script_outputs.arguments_text(cfg, script, script=Path("train.py"), env={"OMP_NUM_THREADS": "2"})
    assert "- Trainer (line 12): precision='bf16-mixed'" in text
    assert "- training DataLoader (line 30): num_workers=1" in text and "export OMP_NUM_THREADS=2" in text


# --- the check, a child process per script

@pytest.mark.slow
def test_the_check_reads_a_datamodule_script_and_one_that_passes_its_loaders_to_fit():
    task = load_task(SCRIPTS / "datamodule.py")
    script = task.script
    assert isinstance(script, LightningFacts) and task.kind == KIND
    assert script.batch_holder == "datamodule.batch_size" and task.batch_size == 16 and task.dataset_len == 2048
    assert script.metric == "val_acc" and script.greater_is_better and task.has_evaluate
    assert (script.trainer_line, script.fit_line, script.loader_line) == (73, 76, 40)
    passed = load_task(EXAMPLES / "lightning_dataloaders.py")
    assert isinstance(passed.script, LightningFacts) and passed.script.source_module == "pytorch_lightning"
    assert passed.script.batch_holder is None and passed.script.loader_source == "fit"
    assert passed.script.metric == "val_loss" and not passed.script.greater_is_better
    assert left_running(SCRIPTS / "datamodule.py") == []


@pytest.mark.slow
def test_an_iterable_of_its_own_is_taken_without_its_dataloader_knobs():
    task = load_task(SCRIPTS / "own_iterable.py")
    assert isinstance(task.script, LightningFacts) and task.script.loader_kind == "Batches"
    assert "not a torch DataLoader" in task.script.skipped()["num_workers"]


@pytest.mark.slow
def test_a_trainer_written_for_several_devices_is_checked_as_one_process():
    """Lightning's own launcher would start the other processes as the bare script: the check
    would wait on ranks that never join it."""
    task = load_task(SCRIPTS / "two_devices.py", timeout_s=120)
    assert isinstance(task.script, LightningFacts) and task.script.trainer_values["devices"] == 2
    assert task.script.overrides(task.script.baseline(TrialConfig())) == {"trainer": {"devices": 1}}
    assert left_running(SCRIPTS / "two_devices.py") == []


@pytest.mark.slow
def test_a_script_that_never_fits_is_ended_and_named():
    msg = contract_error(SCRIPTS / "never_fits.py", timeout_s=8)
    assert "never_fits.py: the script did not reach its Trainer's first steps within 8 s" in msg


@pytest.mark.slow
def test_a_script_that_ends_without_fitting_is_named():
    msg = contract_error(SCRIPTS / "ends_without_fit.py")
    assert "ends_without_fit.py ended without calling Trainer.fit()" in msg and "autotune run SCRIPT -- ARGS" in msg


@pytest.mark.slow
def test_a_script_that_fits_twice_is_named_with_its_lines():
    msg = contract_error(SCRIPTS / "fits_twice.py")
    assert "fits_twice.py:7: the script calls fit() more than once (lines 6, 7)" in msg


@pytest.mark.slow
def test_a_trainer_pinned_to_an_accelerator_the_machine_lacks_is_named():
    msg = contract_error(SCRIPTS / "needs_gpu.py")
    assert "asks for accelerator='gpu', which this machine does not have" in msg and 'accelerator="auto"' in msg


@pytest.mark.slow
def test_a_script_that_fails_before_fit_shows_its_own_frames():
    msg = contract_error(SCRIPTS / "fails_before_fit.py")
    assert "the script raised an error before its Trainer's first steps" in msg
    assert 'fails_before_fit.py", line 7, in load_data' in msg and "data/train.pt: no such file" in msg
    assert "autotune/" not in msg.split("Traceback")[1]


@pytest.mark.slow
def test_each_knob_takes_effect_inside_the_trainer_and_dataloader_of_a_trial(tmp_path):
    from autotune.probes import probe_machine
    from autotune.trials.protocol import Measurement, Status
    from autotune.trials.runner import TrialRunner

    task = load_task(SCRIPTS / "datamodule.py")
    assert task.script is not None
    machine = probe_machine()
    runner = TrialRunner(model_file=task.path, machine=machine, workdir=tmp_path, script=task.script,
                         measurement=Measurement(window_s=0.2, windows=2))
    base = task.script.baseline(TrialConfig())
    tuned = base.replace(batch_size=32, num_workers=1, persistent_workers=True, threads=1, precision="bf16",
                         compile="default")
    result = runner.run(tuned, name="tuned")
    assert result.status == Status.OK and result.value, result.message
    ran = result.facts
    assert ran["loader"]["batch_size"] == 32 and ran["loader"]["num_workers"] == 1
    assert ran["loader"]["persistent_workers"] and ran["loader"]["shuffle"]  # the user's own shuffle, kept
    assert ran["trainer"]["precision"] == "bf16-mixed" and ran["compiled"]  # its training_step logs, compiled
    assert ran["trainer"]["loggers"] == 0 and not ran["trainer"]["checkpointing"]  # nothing saved or logged
    assert str(tmp_path) in ran["default_root_dir"]
    assert len(ran["loader_worker_pids"]) == 1 and result.env["OMP_NUM_THREADS"] == "1"
    scored = runner.run(base, name="base", quality_steps=4, evaluate_at=(2,))
    assert scored.status == Status.OK and len(scored.losses) == 4, scored.message
    assert scored.metric is not None and 0 <= scored.metric <= 1  # val_acc, read from its validation loop
    assert [s for s, _ in scored.evaluations] == [2, 4]  # before step 2, and at the end


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_each_rank_runs_the_layout_inside_its_trainer_in_a_trial_and_in_launch_sh(tmp_path):
    """Two ranks of one thread each: every rank's Lightning Trainer runs under DDP with world size
    2, one thread and half the global batch, in a trial (scored by its validation loop too) and
    in a run of the emitted launch.sh, whose rank 0 reports the global rate."""
    from autotune.probes import probe_machine
    from autotune.trials.protocol import Status

    task = load_task(SCRIPTS / "datamodule.py")
    assert task.ranks_reorder
    machine = probe_machine()
    ranks = [{"rank": r, "world_size": 2, "threads": 1, "batch_size": 16} for r in range(2)]
    runner, two, result = two_rank_trial(task, machine, tmp_path / "trial")
    assert result.status == Status.OK and result.value, result.message
    assert result.facts["ranks"] == ranks and result.facts["trainer"]["world_size"] == 2
    scored = runner.run(two, name="scored", quality_steps=4, evaluate_at=(2,))
    assert scored.status == Status.OK and len(scored.losses) == 4, scored.message
    assert scored.metric is not None and 0 <= scored.metric <= 1

    ran = emitted_report(task, two, machine, tmp_path / "emitted")
    assert ran["facts"]["ranks"] == ranks and ran["samples_per_s"] > 0


# --- one real run, shared by the tests below

SLOW_ARGS = ("--seconds-per-sample", "0.001")


@pytest.fixture(scope="module")
def tuned(tmp_path_factory) -> SimpleNamespace:
    """``autotune run datamodule.py -- ARGS``: a DataModule script whose two DataLoader workers
    are clearly faster (sleeps set its speeds; one worker only matches the main process), three
    trials of threads, short windows; the knobs that only lengthen the verification are fixed
    (several ranks have their own test). After its fit the script saves a checkpoint and
    writes a marker, both to absolute paths outside the output folder (``elsewhere``)."""
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    argv = (*SLOW_ARGS, "--save-to", str(elsewhere / "final.ckpt"), "--marker", str(elsewhere / "fitted.txt"))
    out = tmp_path_factory.mktemp("lightning") / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "autotune", "run", str(SCRIPTS / "datamodule.py"), "--out", str(out), "--trials", "3", "--fix", "nprocs=1",
         "--fix", "num_workers=2", "--fix", "compile=off", "--fix", "precision=fp32", "--fix", "affinity=none", "--fix", "allocator=default",
         "--fix", "batch_size=16", "--window", "0.3", "--windows", "2", "--rounds", "2", "--pairs", "2",
         "--pair-seconds", "0.5", "--no-profile", "--", *argv],
        capture_output=True, text=True, timeout=900)
    return SimpleNamespace(out=out, proc=proc, argv=argv, left=sorted(p.name for p in elsewhere.iterdir()),
                           running=left_running(SCRIPTS / "datamodule.py"),
                           doc=json.loads((out / "best_config.json").read_text())
                           if (out / "best_config.json").exists() else None)


def read_back(out: Path, command: list[str], tmp_path: Path) -> dict:
    """The arguments the Trainer and its DataLoader ran with, read from inside a timed run."""
    report = tmp_path / f"report-{len(list(tmp_path.iterdir()))}.json"
    subprocess.run([*command, "--max-steps", "4", "--report", str(report)], cwd=out, check=True,
                   capture_output=True, timeout=300)
    return json.loads(report.read_text())["facts"]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_lightning_script_is_tuned_and_verified_by_running_it(tuned):
    assert tuned.proc.returncode == 0, tuned.proc.stdout[-3000:] + tuned.proc.stderr[-3000:]
    doc = tuned.doc
    assert doc["verified"] and doc["config"]["num_workers"] > 0
    assert doc["script"]["kind"] == KIND and doc["outputs"]["script"] == "run_tuned.py"
    settings = json.loads((tuned.out / "run_tuned.json").read_text())
    assert settings["argv"] == list(tuned.argv) and settings["kind"] == KIND
    assert settings["overrides"]["loader"]["num_workers"] == doc["config"]["num_workers"]
    arguments = (tuned.out / "tuned_arguments.md").read_text()
    assert f"training DataLoader (line 40): num_workers={doc['config']['num_workers']}" in arguments
    assert "in your script: training DataLoader (line 40)" in tuned.proc.stdout
    one_screen(tuned.proc.stdout, tuned.out)
    assert "trial 1/" in tuned.proc.stderr and "\x1b[" not in tuned.proc.stderr
    assert (tuned.out / "tuned_runtime" / "lightning_script.py").is_file()
    assert "your script's tuned Trainer and DataLoader arguments" in (tuned.out / "report.md").read_text()


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_emitted_arguments_are_what_the_trainer_and_its_dataloader_run(tuned, tmp_path):
    assert tuned.doc is not None, tuned.proc.stderr[-3000:]
    emitted = json.loads((tuned.out / "run_tuned.json").read_text())["overrides"]
    for command in ([sys.executable, "run_tuned.py"], ["bash", "launch.sh"]):
        ran = read_back(tuned.out, command, tmp_path)
        assert {k: ran["loader"][k] for k in emitted["loader"]} == emitted["loader"], command
        assert ran["loader"]["batch_size"] == 16 and ran["loader"]["shuffle"]  # the script's own, unchanged
        assert ran["trainer"]["loggers"] == 0  # a timed run logs and saves nothing
    as_written = read_back(tuned.out, [sys.executable, "run_tuned.py", "--as-written"], tmp_path)
    assert as_written["loader"]["num_workers"] == 0  # the script as it is: the baseline
    reports = [json.loads(p.read_text()) for p in (tuned.out / "verify").rglob("script-report.json")]
    ran_loaders = [r["facts"]["loader"] for r in reports if r.get("facts")]
    assert any(all(r[k] == v for k, v in emitted["loader"].items()) for r in ran_loaders), ran_loaders


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_no_process_of_the_run_goes_past_the_scripts_fit(tuned):
    """The check, the trials, the gates and the standalone pairs ran the script: none saved its
    checkpoint or wrote its marker (the code after fit()), and none is left running."""
    assert tuned.doc is not None, tuned.proc.stderr[-3000:]
    assert list((tuned.out / "verify").rglob("script-report.json"))  # the standalone pairs did run it
    assert tuned.left == [] and tuned.running == []
