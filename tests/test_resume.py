"""A killed tuner resumes (issue 6): every trial completed before the kill
is kept with its value, the trial that was running is marked failed and measured again,
and the study goes on to completion.

Two levels: the search loop alone, killed with SIGKILL at each kind of trial (baseline,
heuristic, sampled, the last of the budget), with a stand-in runner so that it takes
seconds; and the real ``autotune run`` on a model file that fails for some
configurations (batches above its own, DataLoader workers), SIGKILLed mid-trial and
run again to the end.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import optuna
import pytest
from optuna.trial import TrialState

from helpers import one_screen, pinned_allocator, read_stale, read_trials, survivors, trial_measuring

# One xdist worker runs this module: its module fixture runs once (README: pytest -n 2).
pytestmark = pytest.mark.xdist_group("resume")

FAULTY = Path(__file__).resolve().parent / "models" / "faulty"
REPO = Path(__file__).resolve().parent.parent

optuna.logging.set_verbosity(optuna.logging.WARNING)


# --- helpers ---------------------------------------------------------------------------


def check_resumed(killed: list, after: list, stale_numbers: list[int]) -> None:
    """The contract of a resume: completed trials kept, the running one failed as
    interrupted and measured again, nothing left running or waiting."""
    running = [t for t in killed if t.state == TrialState.RUNNING]
    assert len(running) == 1, [(t.number, t.state) for t in killed]
    stale = running[0]
    by_number = {t.number: t for t in after}

    for t in killed:
        if t.state == TrialState.COMPLETE:
            kept = by_number[t.number]
            assert kept.state == TrialState.COMPLETE and kept.value == t.value, (
                f"trial {t.number} completed before the kill and was lost or changed")
        elif t.state.is_finished():
            assert by_number[t.number].state == t.state

    again = by_number[stale.number]
    assert again.state == TrialState.FAIL, again.state
    assert stale.number in stale_numbers, "the resumed search did not record the trial as stale"
    # A trial killed between being asked for and getting its configuration (the one that
    # measured when the kill was decided had ended by the time it landed) measured nothing,
    # and has nothing to measure again.
    if "config" in stale.user_attrs:
        retries = [t for t in after
                   if t.number > stale.number
                   and t.user_attrs.get("config") == stale.user_attrs["config"]
                   and t.user_attrs.get("duplicate_of") is None
                   and "result" in t.user_attrs]
        assert retries, (f"trial {stale.number} ({stale.user_attrs.get('role') or 'sampled'}) was "
                         "interrupted and never measured again")
        assert retries[0].state.is_finished()
    left = [(t.number, t.state.name, t.user_attrs.get("role")) for t in after
            if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    assert not left, f"trials left unfinished after the resumed run: {left}"


# --- the search loop, killed at each kind of trial --------------------------------------

BUDGET = 4  # --trials of the simulated search

SIM = r'''
import json, os, signal, sys
from pathlib import Path

from autotune.search.starts import heuristics
from autotune.probes import as_machine
from autotune.search.budget import SearchBudget
from autotune.search.course import Course, Starts
from autotune.search.tuner import Tuner, open_study
from autotune.space import build_space
from autotune.trials.logs import read_event
from autotune.trials.runner import TrialResult


journal, opts = Path(sys.argv[1]), json.loads(sys.argv[2])
MACHINE = as_machine({"cpu": {"usable_cores": 2, "usable_cpus": [0, 1], "isa": {}},
                      "backends": {"gloo": True}, "allocators": {}, "gpus": []})
space = build_space(MACHINE, baseline_batch=16, dataset_len=512,
                    fixed={"nprocs": 1, "compile": "off", "affinity": "none",
                           "allocator": "default", "interop_threads": None, **opts["fixed"]})


class StandInRunner:
    # Measures nothing: a throughput from the config. SIGKILLs its own process (the
    # tuner) when asked for its kill_at-th measurement, as a killed tuner would die.
    calls = 0
    timeout_s = 300.0

    def run(self, cfg, *, name, on_window=None, profile=False, **kwargs):
        if profile:  # where the step goes: nothing to say, and not a measurement
            return TrialResult(status="ok")
        n, StandInRunner.calls = StandInRunner.calls, StandInRunner.calls + 1
        if n == opts["kill_at"]:
            os.kill(os.getpid(), signal.SIGKILL)
        value = 1000.0 + 10 * cfg.batch_size + cfg.num_workers + 100 * (cfg.threads or 0)
        if cfg.threads is None and opts.get("baseline_best"):
            value = 10_000.0
        return TrialResult(status="ok", value=value, values=[value] * 3, iqr=0.0,
                           setup=read_event({"e": "setup", "threads": cfg.threads or 2}))


study = open_study(storage_path=journal, study_name="sim")
Tuner(study=study, space=space, runner=StandInRunner(), course=Course(
    budget=SearchBudget(trials=opts["trials"]), starts=Starts(heuristics=heuristics(space, MACHINE)))).run()
'''


def run_sim(tmp_path: Path, **opts) -> subprocess.CompletedProcess:
    script = tmp_path / "sim.py"
    script.write_text(SIM)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    opts = {"trials": BUDGET, "kill_at": -1, "fixed": {}, **opts}
    return subprocess.run(
        [sys.executable, str(script), str(tmp_path / "study.journal"), json.dumps(opts)],
        capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)



@pytest.mark.slow
@pytest.mark.parametrize(
    "kill_at",
    [
        pytest.param(0, id="baseline"),
        pytest.param(1, id="heuristic"),
        pytest.param(2, id="sampled"),
        pytest.param(BUDGET - 1, id="last-of-budget"),
    ],
)
def test_killed_search_resumes_and_retries_the_running_trial(tmp_path, kill_at):
    first = run_sim(tmp_path, kill_at=kill_at)
    assert first.returncode == -signal.SIGKILL, first.stderr
    killed = read_trials(tmp_path / "study.journal")
    second = run_sim(tmp_path)
    assert second.returncode == 0, second.stderr
    check_resumed(killed, read_trials(tmp_path / "study.journal"), read_stale(tmp_path / "study.journal"))


def test_search_goes_on_when_the_best_is_a_baseline_outside_the_pinned_space(tmp_path):
    done = run_sim(tmp_path, fixed={"threads": 1}, baseline_best=True)
    assert done.returncode == 0, done.stderr[-3000:]
    trials = read_trials(tmp_path / "study.journal")
    assert len([t for t in trials if "result" in t.user_attrs]) >= BUDGET - 1


# --- the real command, SIGKILLed mid-trial and run again ---------------------------------

# Pinned so that only the thread count, num_workers and batch_size are searched: trials
# stay short, and the verification has no precision to gate. (threads is not pinned: see
# the baseline-outside-the-pinned-space test.)
CLI_ARGS = [
    "--trials", "5", "--window", "0.2", "--windows", "2", "--rounds", "2", "--top", "1",
    "--pairs", "2", "--pair-seconds", "0.5", "--no-profile",
    "--trial-timeout", "120",
    "--fix", "nprocs=1", "--fix", "compile=off", "--fix", "precision=fp32",
    f"--fix=allocator={pinned_allocator()}", "--fix", "affinity=none", "--fix", "interop_threads=none", "--fix", "optimizer_step=default",
]


@pytest.fixture(scope="module")
def killed_and_resumed(tmp_path_factory):
    """`autotune run some_configs_fail.py`, SIGKILLed (its process alone, as `kill -9` would)
    while a trial runs and at least two have finished, then run again to the end."""
    tmp = tmp_path_factory.mktemp("resume")
    out = tmp / "out"
    journal = out / "study.journal"
    cmd = [sys.executable, "-m", "autotune", "run", str(FAULTY / "some_configs_fail.py"),
           "--out", str(out), *CLI_ARGS]
    env = {**os.environ, "COLUMNS": "200"}  # progress lines unwrapped
    with open(tmp / "first.log", "w") as log:
        first = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=tmp, env=env,
                                 stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 420
        while True:
            assert first.poll() is None, (
                "the run ended before it could be killed:\n" + (tmp / "first.log").read_text())
            assert time.monotonic() < deadline, "no trial was running after two had finished"
            try:
                trials = read_trials(journal)
            except Exception:
                trials = []
            finished = [t for t in trials if t.state.is_finished()]
            if len(finished) >= 2 and trial_measuring(trials, out):
                break
            time.sleep(0.1)
        os.kill(first.pid, signal.SIGKILL)
        first.wait()
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    # the tuner's trials die with it (they watch their parent): none may outlive it
    orphans = survivors(str(out), grace_s=5.0)
    killed = read_trials(journal)

    second = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp,
                            env=env, stdin=subprocess.DEVNULL)
    left = survivors(str(out))
    return SimpleNamespace(out=out, killed=killed, after=read_trials(journal), second=second,
                           first_log=(tmp / "first.log").read_text(), orphans=orphans, left=left)


def _failed(run) -> list:
    return [t for t in run.after if t.state == TrialState.FAIL
            and t.user_attrs.get("failure") != "interrupted"
            and t.user_attrs.get("duplicate_of") is None and "result" in t.user_attrs]


def _bad(cfg: dict) -> bool:
    """The configurations some_configs_fail.py fails under."""
    return cfg["batch_size"] > 16 or cfg["num_workers"] > 0


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_study_with_failing_configs_runs_to_the_end(killed_and_resumed):
    run = killed_and_resumed
    assert run.second.returncode in (0, 3), run.second.stderr[-4000:]
    one_screen(run.second.stdout, run.out)  # a model file's answer in one screen
    doc = json.loads((run.out / "best_config.json").read_text())
    assert not _bad(doc["config"]), "a failing configuration was chosen"
    emitted = [c["config"] for c in doc["candidates"] if c["outcome"] == "emitted"]
    assert emitted == ([doc["config"]] if doc["verified"] else []), doc["candidates"]
    baseline = [t for t in run.after if t.user_attrs.get("role") == "baseline"
                and t.state == TrialState.COMPLETE]
    assert baseline, "the baseline did not complete"
    failed = _failed(run)
    assert failed, "no configuration failed: the study did not meet the fault"
    for t in failed:
        assert _bad(t.user_attrs["config"]), t.user_attrs
    for t in run.after:
        if t.state == TrialState.COMPLETE and t.user_attrs.get("duplicate_of") is None:
            log = run.out / "trials" / f"trial-{t.number:04d}" / "log.txt"
            assert not _bad(t.user_attrs["config"]), (
                t.number, t.params, t.user_attrs["config"], log.read_text()[-3000:] if log.exists() else "no log")


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_failures_are_classified_and_shown_with_the_trials_own_log(killed_and_resumed):
    run = killed_and_resumed
    for t in _failed(run):
        assert "(fault-injection test)" in t.user_attrs["result"]["log_tail"], t.user_attrs
        if t.user_attrs["config"]["num_workers"] == 0:  # raised in forward, in the user's file
            assert t.user_attrs["failure"] == "user_error", t.user_attrs
        # (raised in a DataLoader worker: see test_faults.py, classified 'error' today)
    shown = run.first_log + run.second.stderr
    assert re.search(r"\| \w+Error: .*\(fault-injection", shown), shown[-4000:]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_sigkilled_run_resumes_without_losing_a_trial(killed_and_resumed):
    run = killed_and_resumed
    assert run.second.returncode in (0, 3), run.second.stderr[-4000:]
    assert "resuming the study" in run.second.stderr
    check_resumed(run.killed, run.after, read_stale(run.out / "study.journal"))


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_no_process_outlives_the_finished_run(killed_and_resumed):
    assert not killed_and_resumed.orphans, "trials outlived the SIGKILLed tuner"
    assert not killed_and_resumed.left, killed_and_resumed.left
