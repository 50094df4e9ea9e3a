"""The plain training loop as a way in: recognised by its source, checked by running it up to
its optimizer's first steps, each fault named with the fix and nothing left running; its
configurations as its batch flag and a patch of its source; each knob read back from inside
the user's own loop in a trial; one real run of examples/loop_mlp.py, tuned, whose patch
applies to a clean copy of the script and whose emitted answer is what the loop runs."""
from __future__ import annotations

import dataclasses
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from autotune.config import Layout, TrialConfig
from autotune.errors import ContractError, UsageError
from autotune.options import parse_metric
from autotune.runtime import loop_patch
from autotune.search.task_space import script_space
from autotune.space import build_space
from autotune.task import load_task
from autotune.task.load import recognise
from autotune.task.loop_script import KIND, PATCH_NAME, LoopFacts
from autotune.task.way_in import PrintedMetric
from autotune.verify.length import OwnTraining, own_training

from doubles import recorded_machine
from helpers import MODELS, contract_error, emitted_report, left_running, one_screen, run_on_a_terminal, two_rank_trial

SCRIPTS = MODELS / "loop"
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
MLP, GPT = EXAMPLES / "loop_mlp.py", EXAMPLES / "loop_gpt.py"

pytestmark = pytest.mark.xdist_group("loop_script")


def facts(**changes) -> LoopFacts:
    base = LoopFacts(argv=("--epochs", "1"), optimizer_line=80, optimizer_class="AdamW", module_name="model",
                     loader_line=76, loader_values={"batch_size": 64, "num_workers": 0, "pin_memory": False,
                                                    "persistent_workers": False, "prefetch_factor": None},
                     batch_flag="--batch-size", flag_value=64, batch=64, image_inputs=True, model_class="ConvNet")
    return dataclasses.replace(base, **changes)


# --- without processes

def test_a_plain_loop_is_recognised_by_its_source(tmp_path):
    for path in (MLP, GPT, *(SCRIPTS / name for name in ("two_optimizers.py", "accumulates.py", "downloads.py"))):
        assert recognise(path, path.read_text()) == KIND, path
    # a model file, a Trainer script and a Lightning script stay what they are
    assert recognise(MODELS / "tiny_cnn.py", (MODELS / "tiny_cnn.py").read_text()) == "model_file"
    assert recognise(EXAMPLES / "hf_trainer.py", (EXAMPLES / "hf_trainer.py").read_text()) == "hf_trainer"
    assert recognise(EXAMPLES / "lightning_datamodule.py",
                     (EXAMPLES / "lightning_datamodule.py").read_text()) == "lightning"
    # a half-written model file that also trains is told what it lacks, as a model file
    half = "import torch\ndef build_dataset():\n    pass\nopt = torch.optim.SGD(m.parameters())\nl.backward()\nopt.step()\n"
    assert recognise(tmp_path / "m.py", half) == "model_file"
    # torch without an optimizer's step is nothing autotune can tune
    assert recognise(tmp_path / "x.py", "import torch\nprint(torch.ones(2))\n") is None


def test_the_baseline_changes_nothing_and_each_knob_its_own_place():
    script = facts()
    base = script.baseline(TrialConfig())
    assert (base.batch_size, base.num_workers, base.precision, base.compile) == (64, 0, "fp32", "off")
    assert script.overrides(base) == {} and script.edits({}) == {} and script.argv_with({}) == ["--epochs", "1"]
    tuned = base.replace(batch_size=128, num_workers=2, persistent_workers=True, prefetch_factor=4,
                         precision="bf16", compile="default")
    overrides = script.overrides(tuned)
    assert overrides == {"--batch-size": 128, "DataLoader.num_workers": 2, "DataLoader.persistent_workers": True,
                         "DataLoader.prefetch_factor": 4, "autocast": "bfloat16", "compile": "default"}
    assert script.argv_with(overrides) == ["--epochs", "1", "--batch-size", "128"]
    assert script.flags(overrides) == ["--batch-size", "128"]
    edits = script.edits(overrides)
    assert edits["loader"] == {"line": 76, "kwargs": {"num_workers": "2", "persistent_workers": "True",
                                                      "prefetch_factor": "4"}}
    assert edits["after"]["line"] == 80
    assert [s.split("  #")[0] for s in edits["after"]["statements"]] == [
        "model.forward = torch.autocast('cpu', dtype=torch.bfloat16)(model.forward)",
        "model.forward = torch.compile(model.forward)"]
    # a loop without a batch flag takes its batch in its DataLoader's call
    no_flag = facts(batch_flag=None)
    assert no_flag.overrides(base.replace(batch_size=32)) == {"DataLoader.batch_size": 32}
    assert no_flag.edits({"DataLoader.batch_size": 32})["loader"]["kwargs"] == {"batch_size": "32"}
    assert facts(argv=("--batch-size=16",)).argv_with({"--batch-size": 128}) == ["--batch-size=128"]


def test_the_printed_metric_is_read_by_the_steps_before_it_in_its_own_sense():
    """What a scored training of a loop reads of its script's output, without a process: each
    line the pattern matches, its group as a number by the steps taken before it, turned so that
    higher is better; a match that is no number, or no match, is said with the fix."""
    from autotune.trials.printed import PrintedScores

    stepper = SimpleNamespace(losses=[0.0] * 8, thread=None)
    scores = PrintedScores(r"val_loss (\S+)", greater_is_better=False, stepper=stepper)
    for line in ("epoch 0 train_loss 2.5", "val_loss 1.25,", "val_loss nan?"):
        scores.line(line)
    stepper.losses += [0.0] * 8
    scores.line("[rank0] val_loss 0.75")
    assert scores.scores == [(8, -1.25), (16, -0.75)]
    assert "matched 'val_loss nan?', but what it captured is not a number" in scores.missing(16)
    whole = PrintedScores(r"acc=[0-9.]+", greater_is_better=True, stepper=stepper)
    whole.line("acc=0.5")
    assert whole.scores == []  # no group: the whole match, "acc=0.5", is no number
    assert "is not a number: put a group around the number alone" in whole.missing(16)
    silent = PrintedScores(r"val_acc (\S+)", greater_is_better=True, stepper=stepper)
    assert "printed no line that --metric 'val_acc (\\\\S+)' matches in its 16 steps" in silent.missing(16)


def test_the_command_line_names_the_metric_the_check_is_given():
    from autotune.cli import build_parser
    from autotune.commands import run_options
    from autotune.pipeline import printed_metric

    args = build_parser().parse_args(["run", "train.py", "--metric", r"val_loss=(\S+)", "--metric-lower-is-better"])
    assert printed_metric(run_options(args)) == PrintedMetric(r"val_loss=(\S+)", greater_is_better=False)
    assert printed_metric(run_options(build_parser().parse_args(["run", "train.py"]))) is None


def test_a_training_of_so_many_steps_keeps_its_samples_at_another_batch():
    """A loop that trains so many steps (nanoGPT's --max_iters) would train more samples, for
    longer, at a larger batch: the answer scales its steps to keep your samples, so that the
    speedup is the job's; a measurement still runs the script's own steps (its windows need
    them), a quality gate's training the answer's."""
    script = facts(argv=("--max_iters", "300"), length={"max_steps": 300, "steps_flag": "--max_iters"}, batch=16)
    assert script.user_values == {"max_steps": 300}
    larger = script.baseline(TrialConfig()).replace(batch_size=128)
    overrides = script.overrides(larger)
    assert overrides == {"--batch-size": 128, "--max_iters": 38}
    assert script.flags(overrides) == ["--batch-size", "128", "--max_iters", "38"]
    assert script.argv_with(overrides) == ["--max_iters", "38", "--batch-size", "128"]
    assert script.trial(overrides)[0] == ("--max_iters", "300", "--batch-size", "128")
    assert script.trial(overrides, scored=True)[0] == ("--max_iters", "38", "--batch-size", "128")
    said = script.instructions(overrides, script=GPT)
    assert "    --batch-size 128 --max_iters 38" in said
    assert any(line.startswith("`--max_iters 38` keeps your training's samples") for line in said)
    # an epoch-bounded loop trains the same samples at any batch: its flags stay as they are
    assert facts(length={"epochs": 3}).overrides(larger) == {"--batch-size": 128}


def test_the_space_names_what_a_loop_cannot_take():
    space = build_space(recorded_machine("avx2_epyc"), baseline_batch=64)
    taken = script_space(space, facts())
    assert "num_workers" in taken.choices and "batch_size" in taken.choices and "compile" in taken.choices
    assert "channels_last" not in taken.choices and "plain loop" in taken.excluded["channels_last"]
    # nanoGPT-style: no DataLoader, so no loader knobs; its batch from its flag
    drawn = script_space(space, facts(loader_line=None, loader_values={}, batch_flag="--batch_size"))
    assert "num_workers" not in drawn.choices and "batches come from its own code" in drawn.excluded["num_workers"]
    assert "batch_size" in drawn.choices
    fixed = script_space(space, facts(loader_line=None, loader_values={}, batch_flag=None))
    assert "batch_size" not in fixed.choices and "no batch-size flag" in fixed.excluded["batch_size"]
    unnamed = script_space(space, facts(module_name=None))
    assert "compile" not in unnamed.choices and "has no name in the script" in unnamed.excluded["compile"]


def test_a_loop_written_for_ddp_has_its_ranks_searched_where_its_printed_metric_can_judge_them():
    """Written for DDP (it joins a process group, or reads LOCAL_RANK): its ranks are searched,
    each at its share of the global batch through its flag; they shard the data with their own
    sampler, so only the metric it prints can judge them. Not written for DDP, or without a
    metric: one process, each with the reason."""
    import ast

    from autotune.task.loop_script import ddp_line

    assert ddp_line(ast.parse((SCRIPTS / "ddp_loop.py").read_text())) == 28
    assert ddp_line(ast.parse("import os\nrank = int(os.environ['LOCAL_RANK'])\n")) == 2
    assert ddp_line(ast.parse(MLP.read_text())) is None
    space = build_space(recorded_machine("avx2_epyc"), baseline_batch=64)
    assert any(Layout.parse(lay).nprocs > 1 for lay in space.choices["layout"])
    judged = facts(ddp_line=28, metric=r"val_acc (\S+)")
    assert judged.no_ranks is None and judged.ranks_reorder
    taken = script_space(space, judged)
    assert any(Layout.parse(lay).nprocs > 1 for lay in taken.choices["layout"])
    two = judged.baseline(TrialConfig()).replace(nprocs=2, threads=1)
    assert judged.overrides(two) == {"--batch-size": 32}  # each rank's half of the global 64
    # two ranks at its own batch train twice the samples a step: a training of so many steps, half as many
    steps = facts(ddp_line=28, length={"max_steps": 100, "steps_flag": "--max-steps"})
    assert steps.overrides(two.replace(batch_size=128)) == {"--max-steps": 50}
    unjudged = script_space(space, facts(ddp_line=28))
    assert all(Layout.parse(lay).nprocs == 1 for lay in unjudged.choices["layout"])
    [why] = [v for k, v in unjudged.excluded.items() if k.startswith("layout=")]
    assert "--metric" in why
    plain = script_space(space, facts(metric=r"val_acc (\S+)"))
    [why] = [v for k, v in plain.excluded.items() if k.startswith("layout=")]
    assert "not written for DDP" in why and all(Layout.parse(lay).nprocs == 1 for lay in plain.choices["layout"])


def test_a_measurement_runs_past_a_short_training_and_a_scored_one_runs_it_as_answered():
    """A measurement (and the numerics check) ends after its own steps: it runs a hundred times
    the loop's epochs (and its own steps, not the answer's), so that the served rounds of
    verification never outlast a training of a few seconds; a gate's scored training runs the
    length the answer says."""
    epochs = facts(length={"epochs": 1, "epochs_flag": "--epochs"})
    larger = epochs.overrides(epochs.baseline(TrialConfig()).replace(batch_size=128))
    assert epochs.trial(larger)[0] == ("--epochs", "100", "--batch-size", "128")
    assert epochs.trial(larger, scored=True)[0] == ("--epochs", "1", "--batch-size", "128")
    steps = facts(argv=("--max-steps", "100"), length={"max_steps": 100, "steps_flag": "--max-steps"})
    larger = steps.overrides(steps.baseline(TrialConfig()).replace(batch_size=128))
    assert steps.trial(larger)[0] == ("--max-steps", "100", "--batch-size", "128")
    assert steps.trial(larger, scored=True)[0] == ("--max-steps", "50", "--batch-size", "128")


def test_the_summary_names_the_printed_metric_that_judged_a_precision():
    from autotune.document.measures import Check
    from autotune.verify.precision import describe_checks
    from autotune.verify.verdict import Verdict

    judged = Verdict(TrialConfig(precision="bf16"), {"quality": Check(True, {"candidate_metric": 0.7261,
                                                                             "reference_metric": 0.729})})
    said = describe_checks(judged, scored_by=facts(metric=r"val_acc (\S+)").scored_by)
    assert said == "bf16 autocast: the printed val_acc 0.7261 vs 0.729 in fp32", said
    unjudged = Verdict(TrialConfig(precision="bf16"), {"quality": Check(None, {})})
    assert describe_checks(unjudged, scored_by="the printed ") == "bf16 autocast: no metric to check quality with"
    assert describe_checks(unjudged) == "bf16 autocast: no evaluate() to check quality with"


def test_the_patch_is_the_edits_the_trials_run(tmp_path):
    source = MLP.read_text()
    script = facts()
    overrides = script.overrides(script.baseline(TrialConfig()).replace(num_workers=2, precision="bf16"))
    text = script.emitted(overrides, script=MLP)[PATCH_NAME]
    copy = tmp_path / MLP.name
    copy.write_text(source)
    (tmp_path / PATCH_NAME).write_text(text)
    subprocess.run(["git", "apply", PATCH_NAME], cwd=tmp_path, check=True, capture_output=True)
    assert copy.read_text() == loop_patch.patched(source, script.edits(overrides))
    assert "num_workers=2" in copy.read_text() and "torch.autocast('cpu', dtype=torch.bfloat16)" in copy.read_text()


# --- the check, in its child process

@pytest.mark.slow
def test_a_loop_that_never_steps_is_ended_and_named():
    msg = contract_error(SCRIPTS / "never_steps.py", timeout_s=5)
    assert "never_steps.py: the script did not reach its training's first steps within 5 s" in msg
    assert "its optimizer's step()" in msg


@pytest.mark.slow
def test_a_loop_with_two_optimizers_is_named_with_their_lines():
    msg = contract_error(SCRIPTS / "two_optimizers.py")
    assert "two_optimizers.py:7: the script builds 2 optimizers (line 6 (Adam), line 7 (Adam))" in msg
    assert "the one that steps first, at line 7" in msg  # the critic steps first


@pytest.mark.slow
def test_a_loop_that_downloads_its_data_is_named():
    msg = contract_error(SCRIPTS / "downloads.py")
    assert "the script tried to download something" in msg and 'downloads.py", line 8, in load_data' in msg


@pytest.mark.slow
def test_flags_its_parser_refuses_are_named():
    msg = contract_error(MLP, args=("--no-such-flag",))
    assert "the script's argument parser refused the arguments after `--`" in msg
    assert "unrecognized arguments: --no-such-flag" in msg


@pytest.mark.slow
def test_the_check_reads_the_loop_as_it_runs():
    task = load_task(SCRIPTS / "accumulates.py", script_args=("--bs", "4", "--accumulate", "3"))
    script = task.script
    assert isinstance(script, LoopFacts) and task.kind == KIND
    # a step's batch is its micro-batches summed; the flag's value is the micro-batch
    assert (script.batch, script.batch_flag, script.flag_value) == (12, "--bs", 4)
    assert (script.module_name, script.optimizer_line, script.loader_line) == ("net", 17, None)


# --- the knobs, read back from inside the user's own loop

@pytest.mark.slow
@pytest.mark.timeout(600)
def test_each_knob_takes_effect_inside_the_users_loop(tmp_path):
    from autotune.probes import probe_machine
    from autotune.trials.protocol import Measurement, Status
    from autotune.trials.runner import TrialRunner

    machine = probe_machine()
    task = load_task(SCRIPTS / "tiny_loader.py")
    assert task.script is not None
    runner = TrialRunner(model_file=task.path, machine=machine, workdir=tmp_path / "mlp", script=task.script,
                         measurement=Measurement(window_s=0.2, windows=2))
    base = task.script.baseline(TrialConfig())
    tuned = base.replace(batch_size=32, num_workers=1, persistent_workers=True, threads=1, precision="bf16",
                         compile="default")
    result = runner.run(tuned, name="tuned")
    assert result.status == Status.OK and result.value, result.message
    ran = result.facts
    assert ran["loader"]["batch_size"] == 32 and ran["loader"]["num_workers"] == 1  # the flag, and the patch
    assert ran["loader"]["persistent_workers"] and ran["step_samples"] == 32
    assert ran["autocast"] == "bfloat16" and ran["compiled"] and ran["module"] == "Sequential"
    assert ran["threads"] == 1 and result.env["OMP_NUM_THREADS"] == "1"
    assert len(ran["loader_worker_pids"]) == 1
    plain = runner.run(base, name="base")
    assert plain.status == Status.OK and plain.facts["autocast"] is None and not plain.facts["compiled"]
    assert plain.facts["loader"]["batch_size"] == 16 and plain.facts["loader"]["num_workers"] == 0
    # a loop whose parser has no batch flag takes its batch in its DataLoader's call, patched
    unflagged = dataclasses.replace(task.script, batch_flag=None, flag_value=None)
    runner = TrialRunner(model_file=task.path, machine=machine, workdir=tmp_path / "loader", script=unflagged,
                         measurement=Measurement(window_s=0.2, windows=2))
    result = runner.run(base.replace(batch_size=24, threads=1), name="loader")
    assert result.status == Status.OK and result.facts["loader"]["batch_size"] == 24, result.message
    assert result.facts["step_samples"] == 24 and result.facts["batch_flag"]["value"] == 16
    # nanoGPT-style: no DataLoader; the batch through its --batch_size flag
    drawn = load_task(GPT, script_args=("--max_iters", "100000"))
    assert drawn.script is not None and drawn.script.batch_flag == "--batch_size"
    assert drawn.script.user_values == {"max_steps": 100000} and drawn.script.steps_flag == "--max_iters"
    runner = TrialRunner(model_file=drawn.path, machine=machine, workdir=tmp_path / "gpt", script=drawn.script,
                         measurement=Measurement(window_s=0.2, windows=2))
    result = runner.run(drawn.script.baseline(TrialConfig()).replace(batch_size=8, threads=1), name="gpt")
    assert result.status == Status.OK, result.message
    assert result.facts["step_samples"] == 8 and result.facts["loader"] is None
    assert result.facts["batch_flag"]["value"] == 8


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_scored_training_runs_the_loop_to_its_print_and_no_further(tmp_path):
    """--metric: a gate's scored training of a loop is its script run to the first print of the
    metric once the asked steps are taken; the prints before it are its scores along the way, by
    the steps before each; the script's save after its training never runs; a metric it never
    prints fails, named (how the lines read: the test above)."""
    from autotune.probes import probe_machine
    from autotune.trials.protocol import Measurement, Status
    from autotune.trials.runner import TrialRunner

    saved = tmp_path / "saved" / "model.pt"
    saved.parent.mkdir()
    script = SCRIPTS / "prints_metric.py"
    task = load_task(script, script_args=("--save", str(saved)), metric=PrintedMetric(r"val_acc (\S+)"))
    assert task.script is not None and task.has_evaluate and task.scored_by == "the printed val_acc"
    # its training's length, from its parser: what a gate's training is measured against
    assert task.script.user_values == {"epochs": 3} and own_training(task, None) == OwnTraining(384, "epochs=3 of 128 samples")

    def runner(facts, name):
        return TrialRunner(model_file=task.path, machine=probe_machine(), workdir=tmp_path / name, script=facts,
                           measurement=Measurement(window_s=0.2, windows=2))

    base = task.script.baseline(TrialConfig()).replace(threads=1)
    scored = runner(task.script, "scored").run(base, name="scored", quality_steps=10)  # 8 steps an epoch
    assert scored.status == Status.OK, scored.message
    printed = [float(v) for v in re.findall(r"val_acc (\S+)", Path(scored.log_path).read_text())]
    assert len(printed) == 2 and len(scored.losses) == 16  # stopped at the second epoch's print
    assert [tuple(e) for e in scored.evaluations] == [(8, printed[0]), (16, printed[1])]
    assert scored.metric == printed[1]
    # to its end where it prints nothing later: its last print, and its save after it never runs
    whole = runner(task.script, "whole").run(base, name="whole", quality_steps=1000, seed_offset=1)
    assert whole.status == Status.OK and len(whole.losses) == 24, whole.message
    assert len(whole.evaluations) == 3 and whole.evaluations[0][1] != printed[0]  # another seed: another run
    assert not saved.exists() and left_running(script) == []
    # a metric it never prints: named, and the script stopped at its save
    unmatched = dataclasses.replace(task.script, metric=r"val_accuracy=(\S+)")
    failed = runner(unmatched, "unmatched").run(base, name="unmatched", quality_steps=10)
    assert failed.status != Status.OK and f"the script writes {saved} after 24 steps, before it printed a line " \
        "--metric 'val_accuracy=(\\\\S+)' matches" in failed.message, failed.message
    assert not saved.exists()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_each_rank_of_a_loop_written_for_ddp_runs_the_layout_in_a_trial_a_scored_training_and_launch_sh(tmp_path):
    """Two ranks of one thread each: the script's own init_process_group joins the group autotune
    started, and every rank's loop runs with world size 2, one thread and half the global batch,
    in a trial and in a run of the emitted launch.sh (whose rank 0 reports the global rate). A
    scored training of the ranks stops where rank 0 prints the metric, every rank with it."""
    from autotune.probes import probe_machine
    from autotune.trials.protocol import Measurement, Status
    from autotune.trials.runner import TrialRunner

    script = SCRIPTS / "ddp_loop.py"
    task = load_task(script, script_args=("--epochs", "200"), metric=PrintedMetric(r"val_acc (\S+)"))
    assert task.script is not None and task.script.no_ranks is None and task.ranks_reorder
    machine = probe_machine()
    ranks = [{"rank": r, "world_size": 2, "threads": 1, "batch": 16} for r in range(2)]
    runner, two, result = two_rank_trial(task, machine, tmp_path / "trial")
    assert result.status == Status.OK and result.value, result.message
    assert result.facts["ranks"] == ranks and result.facts["world_size"] == 2
    assert result.env["TUNED_NPROCS"] == "2"
    # 128 samples an epoch: 4 steps of 2 x 16; stopped at the second epoch's print, both ranks
    scored = runner.run(two, name="scored", quality_steps=6)
    assert scored.status == Status.OK, scored.message
    printed = [float(v) for v in re.findall(r"val_acc (\S+)", Path(scored.log_path).read_text())]
    assert len(printed) == 2 and len(scored.losses) == 8 and scored.metric == printed[-1]
    assert scored.warnings == [], scored.warnings
    # to its end, where rank 1's script ends before rank 0 (a slow evaluation) prints its score
    whole = dataclasses.replace(task.script, argv=("--epochs", "2", "--eval-seconds", "1"))
    runner = TrialRunner(model_file=task.path, machine=machine, workdir=tmp_path / "whole", script=whole,
                         measurement=Measurement(window_s=0.2, windows=2))
    scored = runner.run(two, name="whole", quality_steps=1000)
    assert scored.status == Status.OK and len(scored.losses) == 8, scored.message
    assert scored.metric == float(re.findall(r"val_acc (\S+)", Path(scored.log_path).read_text())[-1])
    assert scored.warnings == [], scored.warnings
    assert left_running(script) == []
    # a script that joins a group even as one process (written for torchrun alone) is checked as a group of one
    alone = load_task(script, script_args=("--always-join", "--epochs", "1"))
    assert alone.script is not None and alone.script.batch == 16

    ran = emitted_report(task, two, machine, tmp_path / "emitted")
    assert ran["facts"]["ranks"] == ranks and ran["samples_per_s"] > 0
    said = (tmp_path / "emitted" / "tuned_arguments.md").read_text()
    assert "per-device batch of 16, the global batch is 32" in said
    # launch.sh as the user runs it: the script's whole training as 2 ranks, each leaving once it returns
    whole = subprocess.run(["bash", "launch.sh", "--", "--", "--epochs", "2"], cwd=tmp_path / "emitted",
                           capture_output=True, text=True, timeout=300)
    assert whole.returncode == 0, whole.stderr[-3000:]
    assert len(re.findall(r"val_acc (\S+)", whole.stdout)) == 2  # rank 0's prints only
    assert left_running(script) == []


# --- one real run, shared by the tests below

@pytest.fixture(scope="module")
def tuned(tmp_path_factory) -> SimpleNamespace:
    """``autotune run loop_mlp.py -- --epochs 1``: a few trials of threads and bf16 (its batch,
    workers and compile fixed: they only lengthen the run), short windows."""
    out = tmp_path_factory.mktemp("loop") / "out"
    argv = ("--epochs", "1")
    # as a user runs it in a shell: its progress on a terminal (the live panel), its answer read whole
    proc = run_on_a_terminal(
        [sys.executable, "-m", "autotune", "run", str(MLP), "--out", str(out), "--trials", "4",
         "--fix", "num_workers=0", "--fix", "compile=off", "--fix", "batch_size=64", "--fix", "affinity=none",
         "--fix", "allocator=default", "--window", "0.3", "--windows", "2", "--rounds", "2", "--pairs", "2",
         "--pair-seconds", "0.5", "--no-profile", "--", *argv], timeout=900)
    return SimpleNamespace(out=out, proc=proc, argv=argv, running=left_running(MLP),
                           doc=json.loads((out / "best_config.json").read_text())
                           if (out / "best_config.json").exists() else None)


def read_back(out: Path, command: list[str], tmp_path: Path, steps: int = 6) -> dict:
    """What the loop ran with, read from inside a timed run of the emitted answer."""
    report = tmp_path / f"report-{len(list(tmp_path.iterdir()))}.json"
    subprocess.run([*command, "--max-steps", str(steps), "--report", str(report)], cwd=out, check=True,
                   capture_output=True, timeout=300)
    return json.loads(report.read_text())


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_plain_loop_is_tuned_and_answered_in_its_own_terms(tuned, tmp_path):
    assert tuned.proc.returncode in (0, 3), tuned.proc.stdout[-3000:] + tuned.proc.stderr[-3000:]
    doc = tuned.doc
    assert doc is not None and doc["script"]["kind"] == KIND and doc["outputs"]["script"] == "run_tuned.py"
    settings = json.loads((tuned.out / "run_tuned.json").read_text())
    assert settings["argv"] == list(tuned.argv) and settings["kind"] == KIND
    assert (tuned.out / "tuned_runtime" / "loop_script.py").is_file()
    assert (tuned.out / "tuned_runtime" / "loop_patch.py").is_file()
    if doc["config"]["precision"] == "bf16":  # the answer needs code: the patch says it, and applies
        patch = tuned.out / doc["outputs"]["patch"]
        shutil.copy(MLP, tmp_path / MLP.name)
        subprocess.run(["git", "apply", str(patch)], cwd=tmp_path, check=True, capture_output=True)
        assert "torch.autocast('cpu', dtype=torch.bfloat16)" in (tmp_path / MLP.name).read_text()
        assert f"patch -p1 < {patch}" in tuned.proc.stdout
    elif tuned.proc.returncode == 0:
        assert "patch" not in doc["outputs"]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_on_a_terminal_the_run_is_watched_live_and_ends_with_its_answer_in_one_screen(tuned):
    proc = tuned.proc
    assert proc.returncode in (0, 3), proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = one_screen(proc.stdout, tuned.out)
    if proc.returncode == 0 and tuned.doc["config"]["precision"] == "bf16":
        assert any(line.startswith("as a patch of your script: patch -p1 < ") for line in lines)
    # mid-run, the screen said the stage and the time left; at the end the panel is gone
    mid = [text for t, text in proc.seen if t < proc.ended_s - 1.0]
    assert mid and re.search(r"autotune search {2}trial \d of 4", mid[-1]), mid[-1][-2000:]
    assert re.search(r"elapsed, about [\d.,]+ (s|min) left", mid[-1]), mid[-1][-2000:]
    assert "autotune verify" in mid[-1]
    # no per-event lines on a terminal: the panel stands for them
    assert "trial 1/4" not in proc.stderr and "skipping " not in proc.stderr


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_emitted_answer_is_what_the_loop_runs(tuned, tmp_path):
    assert tuned.doc is not None, tuned.proc.stderr[-3000:]
    config = tuned.doc["config"]
    report = read_back(tuned.out, ["bash", "launch.sh"], tmp_path)  # its environment, then run_tuned.py
    ran = report["facts"]
    assert report["steps"] == 6 and report["samples_per_s"]  # a timed run ends after its steps
    assert ran["autocast"] == ("bfloat16" if config["precision"] == "bf16" else None)
    assert ran["step_samples"] == config["batch_size"]
    as_written = read_back(tuned.out, [sys.executable, "run_tuned.py", "--as-written"], tmp_path)["facts"]
    assert as_written["autocast"] is None and as_written["step_samples"] == 64
    # asked for more steps than the script trains (one epoch of 12,000 at 64): the report is of its training
    whole = read_back(tuned.out, [sys.executable, "run_tuned.py", "--as-written"], tmp_path, steps=100_000)
    assert whole["steps"] == 188 and whole["samples_per_s"]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_no_process_of_the_run_is_left_running(tuned):
    assert tuned.doc is not None, tuned.proc.stderr[-3000:]
    assert tuned.running == []


def test_a_larger_batch_is_answered_with_what_nothing_checked(tmp_path):
    """Without --metric a loop's quality is not read: the answer says so where it changes the
    batch, and says nothing of it where the batch stays the user's or a metric judged it."""
    script = facts()
    larger = script.instructions({"--batch-size": 512, "autocast": "bfloat16"}, script=MLP)
    assert any("Nothing checked that your training reaches the quality" in line for line in larger)
    same = script.instructions({"autocast": "bfloat16"}, script=MLP)
    assert not any("Nothing checked" in line for line in same)
    assert script.unjudged[0] == "in a plain loop without --metric" and not script.has_eval
    judged = facts(metric=r"val_acc (\S+)")
    assert judged.has_eval and judged.scored_by == "the printed val_acc"
    assert not any("Nothing checked" in line for line in judged.instructions({"--batch-size": 512}, script=MLP))


def test_a_metric_that_cannot_be_read_is_refused_before_anything_runs():
    for bad, words in (("val_acc ([0-9.]+", "not a regular expression"), (r"(val)_acc (\S+)", "2 groups")):
        with pytest.raises(UsageError, match=re.escape(words)):
            parse_metric(bad)
    assert parse_metric(r"val_acc (\S+)") == r"val_acc (\S+)"
    for path, what in ((MODELS / "tiny_cnn.py", "a model file"), (EXAMPLES / "hf_trainer.py", "hf_trainer script")):
        with pytest.raises(ContractError) as err:
            load_task(path, metric=PrintedMetric(r"acc (\S+)"))
        assert "--metric reads the metric a plain training loop prints" in str(err.value) and what in str(err.value)


def test_on_a_recorded_gpu_node_the_patch_autocasts_on_cuda_and_pins_the_loader():
    """The CUDA paths, on the recorded 1x H100 node (no GPU runs here): its space offers the
    loop pinning and TF32, and a GPU configuration's edits autocast on cuda, pin the DataLoader
    and set TF32 matrix products after the optimizer's line."""
    space = build_space(recorded_machine("h100x1"), baseline_batch=64)
    script = facts(device="cuda:0")
    taken = script_space(space, script)
    assert "pin_memory" in taken.choices and "tf32" in taken.choices["precision"]
    base = script.baseline(taken.baseline)
    assert base.device == "cuda" and base.pin_memory is False
    bf16 = script.overrides(base.replace(precision="bf16", pin_memory=True))
    assert bf16 == {"DataLoader.pin_memory": True, "autocast": "bfloat16"}
    edits = script.edits(bf16)
    assert edits["loader"]["kwargs"] == {"pin_memory": "True"}
    assert edits["after"]["statements"][0].startswith(
        "model.forward = torch.autocast('cuda', dtype=torch.bfloat16)(model.forward)")
    tf32 = script.edits(script.overrides(base.replace(precision="tf32")))
    assert tf32["after"]["statements"][0].startswith("torch.set_float32_matmul_precision('high')")
    assert "autocast" not in str(tf32)

