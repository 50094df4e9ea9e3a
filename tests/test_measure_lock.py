"""One measuring process per machine, taken in turns."""
from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import pytest

from autotune.trials import measure_lock

HOLD_AND_REPORT = textwrap.dedent("""
    import sys, time
    from autotune.trials import measure_lock
    measure_lock.acquire(poll_s=0.02, notice=lambda text: None)
    print(time.time(), flush=True)
    measure_lock.release()
""")


@pytest.mark.slow
def test_second_process_waits_for_the_holder():
    measure_lock.acquire()
    try:
        child = subprocess.Popen([sys.executable, "-c", HOLD_AND_REPORT], stdout=subprocess.PIPE,
                                 text=True)
        time.sleep(1.0)
        released = time.time()
    finally:
        measure_lock.release()
    got = float(child.communicate(timeout=30)[0])
    assert got >= released, "the child measured while the lock was held"


@pytest.mark.slow
def test_a_waiting_process_is_not_starved_by_back_to_back_trials():
    """A process that re-takes the lock right after each release must let a waiter in."""
    measure_lock.acquire()
    child = subprocess.Popen([sys.executable, "-c", HOLD_AND_REPORT], stdout=subprocess.PIPE,
                             text=True)
    time.sleep(1.0)  # the child is waiting now
    start = time.time()
    for _ in range(20):  # back-to-back "trials"
        measure_lock.release()
        measure_lock.acquire(poll_s=0.02, notice=lambda text: None)
        time.sleep(0.1)
    measure_lock.release()
    got = float(child.communicate(timeout=30)[0])
    assert got < start + 1.0, "the waiting process was starved by back-to-back trials"


@pytest.mark.slow
def test_runs_confined_apart_name_their_own_lock(monkeypatch):
    """AUTOTUNE_MEASURE_LOCK names another lock: a process under another name measures
    while this one holds its lock."""
    import os

    monkeypatch.delenv(measure_lock.LOCK_ENV, raising=False)
    measure_lock.acquire()
    try:
        child = subprocess.Popen([sys.executable, "-c", HOLD_AND_REPORT], stdout=subprocess.PIPE, text=True,
                                 env={**os.environ, measure_lock.LOCK_ENV: "cores-1"})
        got = float(child.communicate(timeout=30)[0])
        released = time.time()
    finally:
        measure_lock.release()
    assert got < released, "a process with a lock of its own name waited for this one"
