"""The Trainer script as a way in: recognised by its source, checked by running it up to its
Trainer's first steps, each fault named with the fix and nothing left running; its
configurations as TrainingArguments overrides; one real run of a parsed script, tuned and
verified, whose emitted arguments are read back from inside the Trainer of run_tuned.py and
launch.sh and are those its verified runs ran."""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from autotune.config import TrialConfig
from autotune.emit import script_outputs
from autotune.errors import ContractError
from autotune.search.task_space import script_space
from autotune.space import build_space
from autotune.task import load_task
from autotune.task.load import recognise
from autotune.task.trainer_script import KIND, TrainerFacts, check_trains_once

from doubles import recorded_machine
from helpers import MODELS, contract_error, emitted_report, left_running, one_screen, two_rank_trial

SCRIPTS = MODELS / "trainer"
EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "hf_trainer.py"
PARSED_ARGS = ("--output_dir", "o", "--per_device_train_batch_size", "16", "--report_to", "none")

pytestmark = pytest.mark.xdist_group("trainer_script")


def facts(**values) -> TrainerFacts:
    user = {"per_device_train_batch_size": 8, "gradient_accumulation_steps": 1, "dataloader_num_workers": 0,
            "dataloader_pin_memory": True, "dataloader_persistent_workers": False,
            "dataloader_prefetch_factor": None, "bf16": False, "fp16": False, "tf32": None,
            "torch_compile": False, "torch_compile_mode": None, "optim": "adamw_torch_fused", "seed": 42,
            "use_cpu": False}
    return TrainerFacts(user_values={**user, **values}, parsed=True, argv=("--output_dir", "o"))


# --- without processes

def test_the_kind_of_file_is_read_from_its_source(tmp_path):
    assert recognise(EXAMPLE, EXAMPLE.read_text()) == KIND
    assert recognise(SCRIPTS / "parsed.py", (SCRIPTS / "parsed.py").read_text()) == KIND
    parsed_example = EXAMPLE.with_name("hf_trainer_parsed.py")
    assert recognise(parsed_example, parsed_example.read_text()) == KIND
    assert recognise(MODELS / "tiny_cnn.py", (MODELS / "tiny_cnn.py").read_text()) == "model_file"
    # a model file missing build_model is still one: its check names what is missing
    assert recognise(MODELS / "bad_no_build_model.py", (MODELS / "bad_no_build_model.py").read_text()) == "model_file"
    # model.train() is a module's mode, not a Trainer's training
    assert recognise(tmp_path / "x.py", "import transformers\nmodel.train()\n") is None
    neither = tmp_path / "neither.py"
    neither.write_text("print('hello')\n")
    with pytest.raises(ContractError) as err:
        load_task(neither)
    assert "neither.py: not a file autotune takes" in str(err.value)
    assert "autotune init" in str(err.value) and "Trainer" in str(err.value)


def test_arguments_after_the_double_dash_are_refused_for_a_model_file():
    with pytest.raises(ContractError, match="arguments after `--` go to a script you run"):
        load_task(MODELS / "tiny_cnn.py", script_args=("--output_dir", "o"))


def test_the_baseline_overrides_nothing_and_each_knob_its_own_argument():
    script = facts(dataloader_num_workers=2, dataloader_persistent_workers=True)
    base = script.baseline(TrialConfig())
    assert (base.batch_size, base.num_workers, base.persistent_workers, base.precision) == (8, 2, True, "fp32")
    assert script.overrides(base) == {}
    assert script.overrides(base.replace(batch_size=32)) == {"per_device_train_batch_size": 32}
    assert script.overrides(base.replace(precision="bf16")) == {"bf16": True, "use_cpu": True}
    assert script.overrides(base.replace(num_workers=0, persistent_workers=False)) == {
        "dataloader_num_workers": 0, "dataloader_persistent_workers": False}
    assert script.overrides(base.replace(compile="default")) == {"torch_compile": True}  # the Trainer's default mode
    assert script.overrides(base.replace(compile="max-autotune-no-cudagraphs"))["torch_compile_mode"] == \
        "max-autotune-no-cudagraphs"
    # two ranks: each Trainer's per-device batch is half the global one, on the ranks' own backend
    assert script.overrides(base.replace(nprocs=2, threads=1, batch_size=16)) == {
        "ddp_backend": "gloo", "use_cpu": True}
    assert script.overrides(base.replace(nprocs=2, threads=1, batch_size=32)) == {
        "per_device_train_batch_size": 16, "ddp_backend": "gloo", "use_cpu": True}
    assert script.flags({"bf16": True, "per_device_train_batch_size": 32}) == [
        "--bf16", "True", "--per_device_train_batch_size", "32"]
    # a script written with bf16 has it as its baseline; an fp32 candidate turns it off
    assert facts(bf16=True).baseline(TrialConfig()).precision == "bf16"
    assert facts(bf16=True).overrides(TrialConfig(batch_size=8)) == {"bf16": False}


def test_a_second_training_is_refused_with_its_lines():
    with pytest.raises(ContractError, match=r"train\(\) more than once \(lines 6, 7\)"):
        check_trains_once("t.py", (SCRIPTS / "trains_twice.py").read_text(), 6)
    loop = "import transformers\nfor lr in (1, 2):\n    trainer.train()\n"
    with pytest.raises(ContractError, match="t.py:3: train\\(\\) is called inside a loop"):
        check_trains_once("t.py", loop, 3)
    check_trains_once("t.py", EXAMPLE.read_text(), 49)


def test_the_space_names_what_a_trainer_cannot_take_and_starts_from_the_scripts_values():
    machine = recorded_machine("avx2_epyc")
    script = facts(dataloader_num_workers=3, dataloader_persistent_workers=True)
    space = script_space(build_space(machine, baseline_batch=8, image_inputs=True), script)
    assert "channels_last" not in space.choices and "TrainingArguments" in space.excluded["channels_last"]
    assert "2x1" in space.choices["layout"] and "1x2" in space.choices["layout"]  # its ranks are searched
    assert not any(k.startswith("layout=") for k in space.excluded)
    assert space.baseline.num_workers == 3 and 3 in space.choices["num_workers"]
    assert "adamw_torch_fused" in space.excluded["optimizer_step"]


def test_the_tuned_arguments_are_said_as_the_script_takes_them(tmp_path):
    script = facts()
    cfg = script.baseline(TrialConfig()).replace(batch_size=32)
    text = script_outputs.arguments_text(cfg, script, script=Path("train.py"), env={"OMP_NUM_THREADS": "2"})
    assert "    --per_device_train_batch_size 32" in text
    assert "python train.py --output_dir o --per_device_train_batch_size 32" in text
    given = TrainerFacts(user_values=script.user_values, parsed=True,
                        argv=("--per_device_train_batch_size", "8", "--bf16", "--output_dir=o", "--seed=1"))
    assert given.argv_with({"per_device_train_batch_size": 32, "bf16": False, "output_dir": "p", "tf32": True}) == [
        "--per_device_train_batch_size", "32", "--bf16", "False", "--output_dir", "p", "--seed=1", "--tf32", "True"]
    assert "export OMP_NUM_THREADS=2" in text
    in_code = TrainerFacts(user_values=script.user_values, parsed=False, args_line=33)
    text = script_outputs.arguments_text(cfg, in_code, script=Path("train.py"), env={})
    assert "in code (line 33)" in text and "    per_device_train_batch_size=32," in text


# --- the check, a child process per script

@pytest.mark.slow
def test_the_check_reads_a_script_with_arguments_in_code_and_one_that_parses_them():
    task = load_task(EXAMPLE)
    assert task.kind == KIND and task.script is not None
    assert not task.script.parsed and task.script.args_line == 37 and task.script.train_line == 49
    assert task.has_evaluate and task.script.metric == "eval_loss" and not task.script.greater_is_better
    assert task.batch_size == 8 and task.dataset_len == 2048 and task.script.model_class == "GPT2LMHeadModel"
    parsed = load_task(SCRIPTS / "parsed.py", script_args=PARSED_ARGS)
    assert parsed.script is not None and parsed.script.parsed and parsed.script.argv == PARSED_ARGS
    assert parsed.batch_size == 16 and not parsed.has_evaluate
    assert left_running(EXAMPLE) == [] and left_running(SCRIPTS / "parsed.py") == []


@pytest.mark.slow
def test_a_script_that_never_reaches_its_training_is_ended_and_named(tmp_path, monkeypatch):
    temporary = tmp_path / "tmp"  # where the check's process makes its temporary folders
    temporary.mkdir()
    monkeypatch.setenv("TMPDIR", str(temporary))
    monkeypatch.setattr(tempfile, "tempdir", None)
    msg = contract_error(SCRIPTS / "never_trains.py", timeout_s=8)
    assert "never_trains.py: the script did not reach its Trainer's first steps within 8 s" in msg
    # the ended check's output folder too (the tuner's own warm interpreters' folder stays theirs)
    assert [p.name for p in temporary.iterdir() if p.name.startswith("autotune-check")] == []


@pytest.mark.slow
def test_a_script_that_ends_without_training_is_named():
    msg = contract_error(SCRIPTS / "ends_without_training.py")
    assert "ends_without_training.py ended without calling Trainer.train()" in msg and "autotune run SCRIPT -- ARGS" in msg


@pytest.mark.slow
def test_a_script_that_trains_twice_is_named_with_its_lines():
    msg = contract_error(SCRIPTS / "trains_twice.py")
    assert "trains_twice.py:7: the script calls train() more than once (lines 6, 7)" in msg


@pytest.mark.slow
def test_a_model_from_the_hub_that_is_not_here_is_named():
    msg = contract_error(SCRIPTS / "needs_the_hub.py")
    assert "loads 'autotune-tests/not-on-this-machine' from the Hugging Face Hub" in msg
    assert "hf download autotune-tests/not-on-this-machine" in msg


@pytest.mark.slow
def test_a_script_that_fails_before_training_shows_its_own_frames():
    msg = contract_error(SCRIPTS / "fails_before_training.py")
    assert "the script raised an error before its Trainer's first steps" in msg
    assert 'fails_before_training.py", line 7, in load_data' in msg
    assert "FileNotFoundError: data/train.jsonl: no such file" in msg
    assert "autotune/" not in msg.split("Traceback")[1]  # their frames, not the tuner's


@pytest.mark.slow
def test_arguments_its_parser_refuses_are_named():
    msg = contract_error(SCRIPTS / "parsed.py", ("--output_dir", "o", "--no_such_flag", "1"))
    assert "the script's argument parser refused the arguments after `--`" in msg and "--no_such_flag" in msg


@pytest.mark.slow
def test_a_script_that_raises_on_a_later_step_is_named_with_its_line(tmp_path):
    """Past the check's two steps, the script as written fails in its own code: said in its
    words (its file, line and step, its own frames), exit 2, nothing after its training run."""
    script = SCRIPTS / "fails_on_a_later_step.py"
    proc = subprocess.run([sys.executable, "-m", "autotune", "run", str(script), "--out", str(tmp_path / "out"),
                           "--trials", "2", "--no-profile"], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-3000:]
    said = proc.stderr[proc.stderr.index("autotune run: error:"):]
    assert ("the script as written cannot train, so there is nothing to tune: your script raised RuntimeError "
            "at fails_on_a_later_step.py:13 on its 7th training step: the labels ran out") in said
    assert 'fails_on_a_later_step.py", line 19, in <module>' in said  # its own frames
    assert "site-packages" not in said
    assert not (tmp_path / "never-written.pt").exists()
    assert left_running(script) == []


@pytest.mark.slow
def test_a_trainer_whose_training_ends_in_a_stepped_script_runs_nothing_after_it(tmp_path):
    """The check's, a trial's and a gate's Trainer: where its training returns before autotune
    has measured it, autotune is told and the script's code after train() never runs."""
    driver = (
        "import os, sys\n"
        "from autotune.runtime.hf_script import HfStepper\nfrom autotune.runtime.stepper import ScriptEnded\n"
        "stepper = HfStepper(sys.argv[1], sys.argv[2:], {'report_to': 'none', 'output_dir': 'o', 'max_steps': 3})\n"
        "stepper.start(60)\n"
        "try:\n"
        "    stepper.run_steps(10)\n"
        "except ScriptEnded as exc:\n"
        "    print('ENDED:', exc, flush=True)\n"
        "os._exit(0)\n")
    save_to, marker = tmp_path / "elsewhere" / "model", tmp_path / "elsewhere" / "trained.txt"
    proc = subprocess.run([sys.executable, "-c", driver, str(SCRIPTS / "parsed.py"), *PARSED_ARGS,
                           "--save_to", str(save_to), "--marker", str(marker)],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert "ENDED: parsed.py's Trainer.train() returned before autotune had measured it" in proc.stdout, proc.stderr
    assert not save_to.exists() and not marker.exists()


# --- one real run of a parsed script, shared by the tests below

SLOW_ARGS = (*PARSED_ARGS, "--seconds_per_sample", "0.001", "--logging_steps", "1000")


@pytest.fixture(scope="module")
def tuned(tmp_path_factory) -> SimpleNamespace:
    """``autotune run parsed.py -- ARGS``: a parsed script whose DataLoader workers are clearly
    faster (sleeps set its speeds), three trials, short windows; the knobs that only lengthen
    the verification are fixed (several ranks have their own test). After its training the script saves its model and writes a
    marker, both to absolute paths outside the output folder (``elsewhere``)."""
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    argv = (*SLOW_ARGS, "--save_to", str(elsewhere / "final-model"), "--marker", str(elsewhere / "trained.txt"))
    out = tmp_path_factory.mktemp("trainer") / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "autotune", "run", str(SCRIPTS / "parsed.py"), "--out", str(out), "--trials", "3", "--fix", "nprocs=1",
         "--fix", "compile=off", "--fix", "precision=fp32", "--fix", "affinity=none", "--fix", "allocator=default",
         "--fix", "batch_size=16", "--window", "0.3", "--windows", "2", "--rounds", "2", "--pairs", "2",
         "--pair-seconds", "0.5", "--no-profile", "--", *argv],
        capture_output=True, text=True, timeout=900)
    return SimpleNamespace(out=out, proc=proc, argv=argv, elsewhere=elsewhere,
                           left=sorted(p.name for p in elsewhere.iterdir()), running=left_running(SCRIPTS / "parsed.py"),
                           doc=json.loads((out / "best_config.json").read_text())
                           if (out / "best_config.json").exists() else None)


def read_back(out: Path, command: list[str], tmp_path: Path) -> dict:
    """The arguments the Trainer ran with, read from inside it by a timed run's report."""
    report = tmp_path / f"report-{len(list(tmp_path.iterdir()))}.json"
    subprocess.run([*command, "--max-steps", "4", "--report", str(report)], cwd=out, check=True,
                   capture_output=True, timeout=300)
    return json.loads(report.read_text())["facts"]["training_args"]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_parsed_script_is_tuned_and_verified_by_running_it(tuned):
    assert tuned.proc.returncode == 0, tuned.proc.stdout[-3000:] + tuned.proc.stderr[-3000:]
    doc = tuned.doc
    assert doc["verified"] and doc["config"]["num_workers"] > 0
    assert doc["outputs"]["script"] == "run_tuned.py" and (tuned.out / "run_tuned.py").is_file()
    settings = json.loads((tuned.out / "run_tuned.json").read_text())
    assert settings["parsed"] and settings["argv"] == list(tuned.argv)
    assert settings["overrides"]["dataloader_num_workers"] == doc["config"]["num_workers"]
    arguments = (tuned.out / "tuned_arguments.md").read_text()
    assert f"--dataloader_num_workers {doc['config']['num_workers']}" in arguments
    assert "a Hugging Face Trainer script" in tuned.proc.stdout + tuned.proc.stderr
    flags = " ".join(settings["flags"])
    assert f"on your script's command line: {flags}" in tuned.proc.stdout
    one_screen(tuned.proc.stdout, tuned.out)  # the answer in one screen, its flags on it
    # piped, the progress is the lines a log reads
    assert "trial 1/" in tuned.proc.stderr and "\x1b[" not in tuned.proc.stderr
    assert f"| your script's tuned TrainingArguments | {flags} |" in (tuned.out / "report.md").read_text()


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_emitted_arguments_are_what_the_trainer_runs_and_what_verification_ran(tuned, tmp_path):
    assert tuned.doc is not None, tuned.proc.stderr[-3000:]
    settings = json.loads((tuned.out / "run_tuned.json").read_text())
    emitted = settings["overrides"]
    for command in ([sys.executable, "run_tuned.py"], ["bash", "launch.sh"]):
        ran = read_back(tuned.out, command, tmp_path)
        assert {k: ran[k] for k in emitted} == emitted, command
        assert ran["per_device_train_batch_size"] == 16  # the script's own, unchanged
    as_written = read_back(tuned.out, [sys.executable, "run_tuned.py", "--as-written"], tmp_path)
    assert as_written["dataloader_num_workers"] == 0  # the script as it is: the baseline
    # the standalone pairs ran the winner's launch.sh: their reports show the same arguments
    reports = [json.loads(p.read_text()) for p in (tuned.out / "verify").rglob("script-report.json")]
    ran = [r["facts"]["training_args"] for r in reports if r.get("facts")]
    assert any(all(r[k] == v for k, v in emitted.items()) for r in ran), ran


@pytest.mark.slow
def test_each_knob_takes_effect_inside_the_trainer_of_a_trial(tmp_path):
    """A trial's Trainer runs with its configuration's arguments: read back from inside it."""
    from autotune.probes import probe_machine
    from autotune.trials.protocol import Measurement, Status
    from autotune.trials.runner import TrialRunner

    task = load_task(SCRIPTS / "parsed.py", script_args=PARSED_ARGS)
    assert task.script is not None
    machine = probe_machine()
    runner = TrialRunner(model_file=task.path, machine=machine, workdir=tmp_path, script=task.script,
                         measurement=Measurement(window_s=0.2, windows=2))
    base = task.script.baseline(TrialConfig())
    bf16 = bool(machine.cpu.isa and (machine.cpu.isa.get("avx512_bf16") or machine.cpu.isa.get("amx_bf16")))
    tuned = base.replace(batch_size=32, num_workers=1, persistent_workers=True, threads=1,
                         **({"precision": "bf16"} if bf16 else {}))
    result = runner.run(tuned, name="tuned")
    assert result.status == Status.OK and result.value, result.message
    ran = result.facts["training_args"]
    assert ran["per_device_train_batch_size"] == 32 and ran["dataloader_num_workers"] == 1
    assert ran["dataloader_persistent_workers"] and ran["bf16"] == bf16
    assert result.facts["report_to"] == [] and result.facts["save_strategy"] == "no"
    assert str(tmp_path) in result.facts["output_dir"]  # inside autotune's folder, never the user's
    assert len(result.facts["loader_worker_pids"]) == 1
    assert result.env["OMP_NUM_THREADS"] == "1"
    trajectory = runner.run(base, name="base", trajectory_steps=4)
    assert trajectory.status == Status.OK and len(trajectory.losses) == 4


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_no_process_of_the_run_goes_past_the_scripts_training(tuned, tmp_path):
    """The check, the trials, the gates and the standalone pairs ran the script: none saved its
    model or wrote its marker (the code after train()), and none is left running. The user's
    own launch.sh runs the script whole."""
    assert tuned.doc is not None, tuned.proc.stderr[-3000:]
    assert tuned.left == [] and tuned.running == []
    assert list((tuned.out / "verify").rglob("script-report.json"))  # the standalone pairs did run it
    subprocess.run(["bash", "launch.sh"], cwd=tuned.out, check=True, capture_output=True, timeout=300)
    assert (tuned.elsewhere / "trained.txt").read_text() == "trained\n"
    assert (tuned.elsewhere / "final-model").is_dir()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_each_rank_runs_the_layout_inside_its_trainer_in_a_trial_and_in_launch_sh(tmp_path):
    """Two ranks of one thread each: every rank's Trainer runs with world size 2, one thread and
    half the global batch, in a trial and in a run of the emitted launch.sh, and rank 0's report
    says the global rate."""
    from autotune.probes import probe_machine
    from autotune.trials.protocol import Status

    task = load_task(SCRIPTS / "parsed.py", script_args=PARSED_ARGS)
    machine = probe_machine()
    ranks = [{"rank": r, "world_size": 2, "threads": 1, "per_device_train_batch_size": 16} for r in range(2)]
    _, two, result = two_rank_trial(task, machine, tmp_path / "trial")
    assert result.status == Status.OK and result.value, result.message
    assert result.facts["ranks"] == ranks
    assert result.facts["training_args"]["ddp_backend"] == "gloo"
    assert result.env["TUNED_NPROCS"] == "2"

    ran = emitted_report(task, two, machine, tmp_path / "emitted")
    assert "per-device batch of 16, the global batch is 32" in (tmp_path / "emitted" / "tuned_arguments.md").read_text()
    assert ran["facts"]["ranks"] == ranks and ran["samples_per_s"] > 0
