"""How long the gates' scored trainings are (``verify.length``): the user's own training where
their script or plan says, whole where it is cheap, as far as a training's price holds where
it is not, never past it; and a whole run's verdicts say at which length they were taken."""
from __future__ import annotations

import dataclasses
from pathlib import Path

from test_quality_check import SeededScores

from autotune import pipeline
from autotune.report.console import Reporter
from autotune.task.lightning_script import LightningFacts
from autotune.task.objective import PlannedRun
from autotune.task.trainer_script import TrainerFacts
from autotune.verify.length import GATE_TRAINING_S, OwnTraining, described, gate_samples, own_training

from doubles import recorded_machine
from helpers import knob_cnn, written_document


def trainer(**values) -> TrainerFacts:
    return TrainerFacts(user_values={"per_device_train_batch_size": 4, **values}, parsed=True)


def test_a_trainer_scripts_own_length_is_its_max_steps_else_its_epochs_over_its_data_set():
    task = dataclasses.replace(knob_cnn(), batch_size=4, dataset_len=1000, script=trainer(max_steps=400))
    assert own_training(task, None) == OwnTraining(1600, "max_steps=400 at batch 4")
    epochs = dataclasses.replace(task, script=trainer(max_steps=-1, num_train_epochs=3.0))
    assert own_training(epochs, None) == OwnTraining(3000, "num_train_epochs=3 of 1,000 samples")
    unsized = dataclasses.replace(epochs, dataset_len=None)
    assert own_training(unsized, None) is None, "epochs of a data set without a length: not known"


def test_a_lightning_scripts_own_length_is_its_max_steps_else_its_max_epochs():
    facts = LightningFacts(trainer_values={"max_epochs": 2}, loader_values={"batch_size": 32})
    task = dataclasses.replace(knob_cnn(), batch_size=32, dataset_len=1600, script=facts)
    assert own_training(task, None) == OwnTraining(3200, "max_epochs=2 of 1,600 samples")
    stepped = dataclasses.replace(task, script=dataclasses.replace(facts, trainer_values={"max_steps": 50}))
    assert own_training(stepped, None) == OwnTraining(1600, "max_steps=50 at batch 32")
    # neither: Lightning's own default (1,000 epochs) is no plan of the user's
    assert own_training(dataclasses.replace(task, script=dataclasses.replace(facts, trainer_values={})), None) is None


def test_a_model_files_own_length_is_its_planned_run():
    task = knob_cnn()
    assert own_training(task, None) is None
    plan = PlannedRun.of(train_steps=50, epochs=None, batch_size=task.batch_size, dataset_len=task.dataset_len)
    assert own_training(task, plan) == OwnTraining(50 * task.batch_size, plan.describe())


def test_a_gate_training_is_the_whole_of_a_cheap_training_and_what_its_price_buys_of_a_dear_one():
    cheap = OwnTraining(3200, "max_epochs=2 of 1,600 samples")
    assert gate_samples(cheap, default=6400, slowest=400.0) == 3200, "12 s here: the whole of it, never more"
    # GPT-2 small at 30 samples/s, max_steps 400 at batch 4: the old 6,400 samples were four
    # times the user's whole job
    dear = OwnTraining(1600, "max_steps=400 at batch 4")
    assert gate_samples(dear, default=6400, slowest=30.0) == int(GATE_TRAINING_S * 30)
    assert gate_samples(None, default=6400, slowest=30.0) == 6400, "not known: the default"
    assert gate_samples(dear, default=6400, slowest=None) == 1600, "no rate: the default, never past the user's"
    assert "your training's whole length (max_epochs=2" in described(3200, cheap)
    assert described(900, dear).startswith("900 samples, 56% of your training's 1,600 (max_steps=400")


def tuned_to_a_plan(tmp_path: Path, train_steps: int) -> tuple[dict, list[tuple[int, int]]]:
    """A run of knob_cnn.py under --train-steps, its quality check's scores by seed from a
    stand-in; with the (samples, batch) of every scored training it ran."""
    task = knob_cnn()
    runner = SeededScores(recorded_machine("amx_spr"),
                          fp32=[[0.3, 0.70, 0.74, 0.76], [0.3, 0.66, 0.70, 0.70]],
                          reduced=[[0.3, 0.69, 0.735, 0.755], [0.3, 0.655, 0.69, 0.695]])
    scored: list[tuple[int, int]] = []
    original = runner.run

    def run(cfg, *, name, quality_steps=None, **kw):
        if quality_steps is not None:
            scored.append((quality_steps * cfg.batch_size, cfg.batch_size))
        return original(cfg, name=name, quality_steps=quality_steps, **kw)

    runner.run = run  # type: ignore[method-assign]
    out = tmp_path / f"out-{train_steps}"
    out.mkdir()
    pipeline.execute(task, out, pipeline.RunOptions(trials=12, train_steps=train_steps), machine=runner.doc,
                     runner=runner, reporter=Reporter(quiet=True))
    return written_document(out), scored


def test_a_runs_verdicts_are_taken_at_the_planned_runs_whole_length_and_say_so(tmp_path: Path):
    planned = 1500 * 16  # knob_cnn.py's batch: 24,000 samples, cheap at the stand-in's rates
    doc, scored = tuned_to_a_plan(tmp_path, 1500)
    judged = doc["precision"]["judged"]
    assert scored and judged, doc["precision"]
    assert all(planned <= samples < planned + batch for samples, batch in scored), scored
    for j in judged.values():
        assert "your training's whole length (1,500 steps at batch 16)" in j["length"], j["length"]
    assert "judged after 24," in doc["precision"]["checked"]


def test_no_batch_check_trains_past_a_short_planned_run_and_a_numerics_floor_past_it_is_said(tmp_path: Path):
    planned = 60 * 16
    doc, scored = tuned_to_a_plan(tmp_path, 60)
    assert doc["config"]["batch_size"] == 512, doc["config"]  # the stand-in's fastest
    assert f"after {planned:,} samples against" in doc["batch"]["check"], doc["batch"]["check"]
    # the quality check's training is the numerics check's: 40 steps at the candidate's batch
    for j in doc["precision"]["judged"].values():
        assert j["samples"] <= planned or "the numerics check's steps at batch" in j["length"], j["length"]
