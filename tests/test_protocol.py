import dataclasses
import json

import pytest

from autotune.trials.events import (
    BeatEvent,
    DoneEvent,
    ErrorEvent,
    SetupEvent,
    WarmupEvent,
    WindowEvent,
)
from autotune.trials.logs import read_event
from autotune.trials.protocol import Event, Failure, Measurement, Mode, Role, Status
from autotune.trials.runner import LiveTrial, TrialResult
from autotune.trials.spec import TrialMode, TrialSpec
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
    assert Measurement.from_json(json.loads(json.dumps(m.to_json()))) == m
    with pytest.raises(ValueError, match="window_seconds"):
        Measurement.from_json({"window_seconds": 1.0})


def test_what_the_worker_writes_the_tuner_reads(tmp_path):
    """The worker's event writer and the tuner's reader agree on every field they use."""
    path = tmp_path / "events.jsonl"
    events = Events(str(path), rank=0)
    events.emit(SetupEvent(seconds=0.5, world=1, pid=1))
    events.emit(BeatEvent(step=1))
    events.emit(WarmupEvent(first_step_s=0.2, step_s=0.01, steps_per_window=100))
    events.emit(WindowEvent(i=0, samples_per_s=1234.0, seconds=1.0, steps=100))
    events.emit(DoneEvent(value=1234.0, values=[1234.0], losses=[]))
    Events(str(path), rank=1).emit(WindowEvent(i=1, samples_per_s=1.0, seconds=1.0, steps=1))
    Events(str(path), rank=1).emit(ErrorEvent(kind=Failure.NAN_LOSS, message="nan"), all_ranks=True)
    trial = LiveTrial.failed_to_start(TrialResult(status=Status.OK))
    for line in path.read_text().splitlines():
        event = read_event(json.loads(line))
        assert event is not None
        trial._handle(event)
    result = trial.result
    assert result.values == [1234.0], "only rank 0 reports windows"
    assert result.warmup is not None and result.done is not None
    assert result.warmup.steps_per_window == 100 and result.done.value == 1234.0
    assert trial.step_s == 0.01
    assert result.failure == Failure.NAN_LOSS and result.describe_failure().startswith("the loss")


SETUP_LINE = {"e": "setup", "rank": 0, "t": 100.0, "seconds": 2.0, "process_s": 1.5, "world": 2,
              "backend": "gloo", "pid": 42, "warm": False, "threads": 4, "interop_threads": 1,
              "affinity": [0, 1], "libraries": ["libtcmalloc.so.4"], "env": {"OMP_NUM_THREADS": "4"}}


@pytest.mark.parametrize("line", [
    SETUP_LINE,
    {"e": "beat", "rank": 0, "t": 101.0, "phase": "warmup", "step": 1},
    {"e": "facts", "rank": 0, "t": 101.5, "ddp": True, "utilisation": {"flops_per_sample": None}},
    {"e": "warmup", "rank": 0, "t": 102.0, "first_step_s": 0.5, "step_s": 0.1, "steps_per_window": 10},
    {"e": "warmup", "rank": 0, "t": 102.0, "first_step_s": 0.5, "step_s": 0.1},  # served: no window size
    {"e": "ready", "rank": 0, "t": 103.0},
    {"e": "window", "rank": 0, "t": 104.0, "i": 0, "samples_per_s": 99.5, "seconds": 1.0, "steps": 10},
    {"e": "done", "rank": 0, "t": 105.0, "value": 99.5, "values": [99.5], "iqr": 0.0, "peak_rss_mb": 300.0,
     "rank_peak_mb": 310.0, "cuda_peak_mb": None, "cuda_total_mb": None, "losses": [2.0],
     "minor_faults_per_step": 3.0},
    {"e": "done", "rank": 0, "t": 105.0, "losses": [2.0, 1.9]},  # a trajectory's
    {"e": "done", "rank": 0, "t": 105.0, "losses": [2.0, float("nan")], "metric": None},  # quality, unscored
    {"e": "error", "rank": 1, "t": 106.0, "kind": "out_of_memory", "message": "CUDA out of memory",
     "traceback": "..."},
])
def test_every_event_is_written_back_with_the_keys_and_values_it_was_read_with(line):
    event = read_event(json.loads(json.dumps(line)))
    assert event is not None and line["e"] == event.KIND.value
    written = json.loads(json.dumps(event.to_json()))
    assert list(written) == list(line)  # the keys, in the worker's order
    assert json.dumps(written) == json.dumps(line)


def test_a_line_of_an_unknown_kind_is_passed_over_and_a_stand_ins_short_lines_are_read():
    assert read_event({"e": "something_newer", "t": 1.0}) is None
    setup = read_event({"e": "setup", "seconds": 0.1, "t": 5.0})  # tests' fake worker writes no rank
    assert isinstance(setup, SetupEvent) and setup.seconds == 0.1 and setup.process is None
    error = read_event({"e": "error", "kind": "nan_loss", "message": "nan", "rank": 1})
    assert isinstance(error, ErrorEvent) and error.kind is Failure.NAN_LOSS and error.rank == 1


def test_the_done_event_says_its_mode_by_what_it_carries():
    assert read_event({"e": "done", "value": 1.0, "values": [1.0], "losses": []}).mode is Mode.MEASURE
    assert read_event({"e": "done", "losses": [1.0]}).mode is Mode.TRAJECTORY
    quality = read_event({"e": "done", "losses": [1.0], "metric": 0.5})
    assert quality.mode is Mode.QUALITY and quality.metric == 0.5
    assert set(DoneEvent(mode=Mode.TRAJECTORY, losses=[1.0]).to_json()) == {"e", "rank", "t", "losses"}


def test_the_spec_round_trips_and_keeps_the_keys_specs_always_had(tmp_path):
    spec = TrialSpec(model_file="/m.py", config={"batch_size": 8, "threads": None}, events="/e.jsonl",
                     control="/c", log="/l.txt", measure=Measurement(warmup_steps=2), seed=3)
    assert list(spec.to_json()) == ["model_file", "config", "events", "control", "log", "measure", "seed"]
    traj = dataclasses.replace(spec, mode=TrialMode.trajectory(40), next="/next")
    assert traj.to_json()["mode"] == "trajectory" and traj.to_json()["steps"] == 40
    assert list(traj.to_json())[-3:] == ["mode", "steps", "next"]
    assert TrialMode.serve().to_json() == {"mode": "serve"}
    for one in (spec, traj, dataclasses.replace(spec, mode=TrialMode.serve())):
        one.write(tmp_path / "spec.json")
        assert TrialSpec.read(str(tmp_path / "spec.json")) == one
    # a spec without the measurement, control file or log (a test's, an older runner's)
    short = TrialSpec.from_json({"model_file": "/m.py", "config": {}, "events": "/e", "mode": "quality",
                                 "steps": 5})
    assert short.measure == Measurement() and short.seed == 0 and short.control is None
    assert short.mode == TrialMode.quality(5)


def test_the_summary_stored_on_the_study_keeps_its_keys_and_values():
    setup = read_event(SETUP_LINE)
    result = TrialResult(status=Status.OK, value=99.5, values=[99.5], iqr=0.0, setup=setup,
                         facts={"e": "facts", "rank": 0, "t": 1.0, "ddp": True, "layer_widths": {"fc": 4}},
                         warmup=WarmupEvent(first_step_s=0.5, step_s=0.1, t=102.0),
                         done=DoneEvent(value=99.5, values=[99.5], iqr=0.0, rank_peak_mb=310.04, losses=[2.0],
                                        cuda_peak_mb=1500.0, cuda_total_mb=81559.0),
                         peak_tree_mb=400.0, wall_s=3.0)
    summary = result.summary()
    assert list(summary) == ["status", "value", "values", "iqr", "failure", "message", "log_tail", "one_time_s",
                             "peak_rss_mb", "rank_peak_mb", "wall_s", "phases", "warm", "losses", "facts",
                             "threads_seen", "world", "cuda_peak_mb", "cuda_total_mb"]
    assert summary["one_time_s"] == pytest.approx(0.5 + 0.4)
    assert summary["rank_peak_mb"] == 310.0 and summary["threads_seen"] == 4 and summary["world"] == 2
    assert summary["warm"] is False and summary["losses"] == [2.0]
    assert summary["facts"] == {"e": "facts", "rank": 0, "t": 1.0, "ddp": True}
    empty = TrialResult(status=Status.FAILED).summary()
    assert empty["one_time_s"] is None and empty["threads_seen"] is None and empty["world"] is None
    assert "rank_peak_mb" not in empty and "cuda_peak_mb" not in empty and empty["losses"] == []


def test_windows_written_just_before_the_trial_ends_are_all_counted(tmp_path):
    """A trial whose last window and report land between the tuner's read of its events and
    its look at whether the process lives (a cold process ends right after reporting): the
    report's windows and the windows' own seconds agree, so the trial's measured time
    (``phases['measure_s']``) counts every window."""
    import subprocess
    import sys

    from autotune.trials.live import TrialProcess

    events = Events(str(tmp_path / "events.jsonl"), rank=0)
    events.emit(SetupEvent(seconds=0.5, world=1, pid=1))
    events.emit(WindowEvent(i=0, samples_per_s=100.0, seconds=1.0, steps=10))
    (tmp_path / "trial.log").write_text("")

    class EndsBetweenReadAndLook(TrialProcess):
        ended = False

        def alive(self) -> bool:  # the last lines come, then the process is gone
            if not self.ended:
                events.emit(WindowEvent(i=1, samples_per_s=110.0, seconds=1.5, steps=15))
                events.emit(DoneEvent(value=105.0, values=[100.0, 110.0], losses=[]))
                self.ended = True
            return False

    class Owner:
        timeout_s, hang_s, setup_hang_s, memory_limit_bytes, log_cap_bytes = 60.0, 60.0, None, None, 10**6

        def park(self, process) -> None:
            raise AssertionError("a cold process is not kept")

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        process = EndsBetweenReadAndLook(proc=proc, tmpdir=str(tmp_path / "tmp"))
        seen: list[int] = []
        trial = LiveTrial(Owner(), folder=tmp_path, process=process,
                          result=TrialResult(status=Status.OK, log_path=str(tmp_path / "trial.log")),
                          on_window=lambda i, v: seen.append(i) or False, locked=True)
        assert trial.poll()
    finally:
        proc.kill()
        proc.wait()
    result = trial.result
    assert result.status == Status.OK and result.values == [100.0, 110.0]
    assert result.window_seconds == [1.0, 1.5]
    assert result.phases["measure_s"] == 2.5
    assert seen == [0], "a window read once the trial ended is not offered for pruning"
