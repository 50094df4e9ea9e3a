"""Warm trials: configurations that share their process knobs are measured one after
another in one process, each from the state a fresh process would start it in."""
from __future__ import annotations

from pathlib import Path

import psutil
import pytest

from autotune.config import TrialConfig
from autotune.probes.libraries import find_native_libraries
from autotune.trials.events import SetupEvent, WarmupEvent
from autotune.trials.protocol import Measurement, Status
from autotune.trials.runner import TrialResult, TrialRunner, process_key

from helpers import MODELS, machine_doc

pytestmark = pytest.mark.slow

QUICK = Measurement(warmup_steps=2, window_s=0.2, windows=2)
# Warm processes are for the allocators that keep no state a step's cost depends on
# (glibc's does: its configurations get fresh processes); CI installs tcmalloc.
TCMALLOC = find_native_libraries()[0]["tcmalloc"]
if TCMALLOC is None:
    pytestmark = [pytest.mark.slow, pytest.mark.skip(reason="tcmalloc is not installed (CI installs it: see .ci/run)")]


def runner(tmp_path: Path, model: str = "dropout_cnn.py", *, warm: bool = True) -> TrialRunner:
    return TrialRunner(model_file=MODELS / model, machine={**machine_doc(), "allocators": {"tcmalloc": TCMALLOC}},
                       workdir=tmp_path / "trials", measurement=QUICK, warm=warm, hang_s=60.0)


def cfg(**knobs) -> TrialConfig:
    return TrialConfig(**{"allocator": "tcmalloc", **knobs})


def test_process_knobs_decide_which_configurations_share_a_process():
    base = cfg(batch_size=16)
    in_process = base.replace(num_workers=2, persistent_workers=True, precision="bf16",
                              channels_last=True, prune_ratio=0.25, pin_memory=True, batch_size=64)
    assert process_key(in_process) == process_key(base)
    for other in (base.replace(threads=1), base.replace(nprocs=2, threads=1), base.replace(allocator="jemalloc"),
                  base.replace(affinity="compact"), base.replace(interop_threads=1)):
        assert process_key(other) != process_key(base), other
    assert process_key(base.replace(compile="default")) is None  # a compiled one starts fresh
    # glibc's allocator: every configuration in a fresh process on the CPU; on a GPU the
    # step's cost is the device's, and the process (its CUDA context) is worth keeping
    assert process_key(base.replace(allocator="default")) is None
    assert process_key(base.replace(allocator="default", device="cuda")) is not None


def test_a_warm_process_trains_a_configuration_as_a_fresh_one_would(tmp_path):
    """The same losses to the last bit, after another configuration (with persistent
    DataLoader workers, bf16, channels_last) ran in that process; and that one's DataLoader
    workers are gone before the next one starts."""
    reference = cfg(batch_size=16)
    other = cfg(batch_size=16, num_workers=2, persistent_workers=True, precision="bf16",
                        channels_last=True)
    fresh = runner(tmp_path / "fresh", warm=False).run(reference, name="fresh", trajectory_steps=12)
    assert fresh.status == Status.OK, fresh.describe_failure()

    r = runner(tmp_path / "warm")
    try:
        first = r.run(reference, name="first", trajectory_steps=12)
        between = r.run(other, name="between")
        assert between.status == Status.OK, between.describe_failure()
        assert between.facts.get("loader_worker_pids"), "the configuration in between had no DataLoader workers"
        (idle,) = r._idle.values()
        assert idle.proc.pid == between.setup.pid == first.setup.pid
        assert not psutil.Process(idle.proc.pid).children(recursive=True), \
            "the DataLoader workers of the configuration before outlived it"
        again = r.run(reference, name="again", trajectory_steps=12)
    finally:
        r.close()
    assert again.setup.warm is True and again.setup.pid == first.setup.pid
    assert first.setup.warm is False
    assert first.losses == fresh.losses
    assert again.losses == fresh.losses, "a warm process trained another model or other batches"


def test_each_warm_trial_writes_its_own_log_and_events(tmp_path):
    r = runner(tmp_path)
    try:
        a = r.run(cfg(batch_size=16), name="a")
        b = r.run(cfg(batch_size=16, precision="bf16"), name="b")
    finally:
        r.close()
    assert a.status == b.status == Status.OK
    assert b.setup.warm is True
    # what a step's memory costs the system: how warm and fresh processes differ under glibc
    assert all(r.done.minor_faults_per_step >= 0 for r in (a, b))
    events_b = (tmp_path / "trials" / "b" / "events.jsonl").read_text()
    assert '"setup"' in events_b and '"done"' in events_b
    assert '"setup"' in (tmp_path / "trials" / "a" / "events.jsonl").read_text()
    assert a.log_path != b.log_path and Path(b.log_path).exists()


def test_configurations_with_other_process_knobs_get_a_process_of_their_own(tmp_path):
    r = runner(tmp_path)
    try:
        one = r.run(cfg(batch_size=16), name="one")
        ranks = r.run(cfg(nprocs=2, threads=1, batch_size=16), name="ranks")
        ranks_again = r.run(cfg(nprocs=2, threads=1, batch_size=16, precision="bf16"), name="ranks-again")
        back = r.run(cfg(batch_size=16, precision="bf16"), name="back")
    finally:
        r.close()
    for res in (one, ranks, ranks_again, back):
        assert res.status == Status.OK, res.describe_failure()
    assert ranks.setup.pid != one.setup.pid
    assert ranks_again.setup.pid == ranks.setup.pid and ranks_again.setup.warm
    assert ranks_again.setup.world == 2
    assert back.setup.pid == one.setup.pid, "the idle process of the first layout was not kept"


def test_a_failed_configuration_ends_its_process_and_the_next_starts_fresh(tmp_path):
    r = runner(tmp_path, "fails_in_bf16.py")
    try:
        ok = r.run(cfg(batch_size=16), name="ok")
        pid = ok.setup.pid
        failed = r.run(cfg(batch_size=16, precision="bf16"), name="failed")
        assert failed.setup.pid == pid, "the failing configuration ran in the warm process"
        assert failed.status == Status.FAILED and failed.failure == "user_error"
        assert "NoAutocast cannot run under autocast" in failed.message
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        after = r.run(cfg(batch_size=16), name="after")
    finally:
        r.close()
    assert after.status == Status.OK and after.setup.warm is False and after.setup.pid != pid


def test_closing_the_runner_ends_its_idle_processes(tmp_path):
    r = runner(tmp_path)
    res = r.run(cfg(batch_size=16), name="one")
    pid = res.setup.pid
    assert psutil.pid_exists(pid)
    r.close()
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_fresh_trials_measure_every_configuration_in_a_new_process(tmp_path):
    r = runner(tmp_path, warm=False)
    a = r.run(cfg(batch_size=16), name="a")
    b = r.run(cfg(batch_size=32), name="b")
    assert a.setup.pid != b.setup.pid and b.setup.warm is False
    assert not r._idle


def test_a_configurations_one_time_cost_leaves_out_the_process_setup_every_configuration_pays():
    """Fresh or warm, a configuration's one-time cost is its own setup and its first step's
    excess: a fresh process's import and build_dataset would charge it to whichever
    configuration happened to start a process."""

    fresh = TrialResult(status=Status.OK, setup=SetupEvent(seconds=5.0, process_s=4.5),
                        warmup=WarmupEvent(first_step_s=3.0, step_s=1.0))
    warm = TrialResult(status=Status.OK, setup=SetupEvent(seconds=0.5, process_s=0.0),
                       warmup=WarmupEvent(first_step_s=3.0, step_s=1.0))
    assert fresh.one_time_s == warm.one_time_s == 2.5


def test_an_idle_process_leaves_the_gpus_before_a_process_of_other_knobs_starts_on_them(tmp_path):
    """On GPUs an idle warm process would hold its CUDA context on the devices another
    configuration measures on: it is ended before that one starts (here the GPU trial
    itself fails, on a machine without one, after the idle process was ended)."""
    r = runner(tmp_path)
    try:
        res = r.run(cfg(batch_size=16), name="cpu")
        pid = res.setup.pid
        r.run(cfg(batch_size=16, device="cuda"), name="gpu")
        assert not r._idle
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    finally:
        r.close()
