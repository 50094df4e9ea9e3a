import json

import pytest

from autotune.trials.protocol import Event, Failure, Measurement, Mode, Role, Status
from autotune.trials.runner import LiveTrial, TrialResult
from autotune.trials.worker import Events


def test_vocabularies_are_strings_in_json():
    line = json.dumps({"e": Event.WINDOW, "mode": Mode.SERVE, "role": Role.BATCH,
                       "status": Status.OK, "kind": Failure.HANG})
    assert json.loads(line) == {"e": "window", "mode": "serve", "role": "batch",
                                "status": "ok", "kind": "hang"}
    assert Role("baseline") == "baseline" and Role.BASELINE == "baseline"


def test_failure_help_for_every_kind_and_the_kind_itself_for_unknown_ones():
    assert all(kind.help for kind in Failure)
    assert Failure.describe("out_of_memory") == "ran out of memory"
    assert Failure.describe("something_new") == "something_new"
    assert Failure.describe(None) == "failed"


def test_measurement_round_trips_and_rejects_unknown_settings():
    m = Measurement(warmup_steps=4, window_s=0.5, windows=2, max_window_steps=7)
    assert Measurement.from_dict(json.loads(json.dumps(m.to_dict()))) == m
    with pytest.raises(ValueError, match="window_seconds"):
        Measurement.from_dict({"window_seconds": 1.0})


def test_what_the_worker_writes_the_tuner_reads(tmp_path):
    """The worker's event writer and the tuner's reader agree on every field they use."""
    path = tmp_path / "events.jsonl"
    events = Events(str(path), rank=0)
    events.emit(Event.SETUP, seconds=0.5, world=1, pid=1)
    events.emit(Event.BEAT, phase="warmup", step=1)
    events.emit(Event.WARMUP, first_step_s=0.2, step_s=0.01, steps_per_window=100)
    events.emit(Event.WINDOW, i=0, samples_per_s=1234.0, seconds=1.0, steps=100)
    events.emit(Event.DONE, value=1234.0, values=[1234.0], losses=[])
    Events(str(path), rank=1).emit(Event.WINDOW, i=1, samples_per_s=1.0, seconds=1.0, steps=1)
    Events(str(path), rank=1).emit(Event.ERROR, all_ranks=True, kind=Failure.NAN_LOSS, message="nan")
    trial = LiveTrial.failed_to_start(TrialResult(status=Status.OK))
    for line in path.read_text().splitlines():
        trial._handle(json.loads(line))
    result = trial.result
    assert result.values == [1234.0], "only rank 0 reports windows"
    assert result.warmup["steps_per_window"] == 100 and result.done["value"] == 1234.0
    assert trial.step_s == 0.01
    assert result.failure == Failure.NAN_LOSS and result.describe_failure().startswith("the loss")
