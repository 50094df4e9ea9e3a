"""One measuring process per machine, taken in turns."""
from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import pytest

from autotune.trials import measure_lock

# Says "waiting" when it finds the lock held (it then holds the turn: it is next), and the
# time once it holds the lock.
HOLD_AND_REPORT = textwrap.dedent("""
    import sys, time
    from autotune.trials import measure_lock
    measure_lock.acquire(poll_s=0.02, notice=lambda text: print("waiting", flush=True))
    print(time.time(), flush=True)
    measure_lock.release()
""")


def start_waiter() -> subprocess.Popen:
    """The child, once it waits for this process's lock."""
    child = subprocess.Popen([sys.executable, "-c", HOLD_AND_REPORT], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "waiting", "the child took the lock this process holds"
    return child


@pytest.mark.slow
def test_second_process_waits_for_the_holder():
    measure_lock.acquire()
    try:
        child = start_waiter()
        released = time.time()
    finally:
        measure_lock.release()
    got = float(child.communicate(timeout=30)[0])
    assert got >= released, "the child measured while the lock was held"


@pytest.mark.slow
def test_a_waiting_process_is_not_starved_by_back_to_back_trials():
    """A process that re-takes the lock right after each release must let a waiter in:
    the waiter holds the turn, so it measures before the holder's next trial."""
    measure_lock.acquire()
    child = start_waiter()
    taken_again = []
    for _ in range(10):  # back-to-back "trials"
        measure_lock.release()
        measure_lock.acquire(poll_s=0.02, notice=lambda text: None)
        taken_again.append(time.time())
        time.sleep(0.05)
    measure_lock.release()
    got = float(child.communicate(timeout=30)[0])
    assert got < taken_again[0], "the waiting process was starved by back-to-back trials"


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
