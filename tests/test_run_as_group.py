"""tests/helpers.run_as_group: a child run by a test leaves none of the processes it started
behind, and one that started a process still holding its output does not keep the test
waiting (Lightning's DDP test once hung to its timeout so, its ranks left running)."""
from __future__ import annotations

import re
import sys

import psutil
import pytest

from helpers import run_as_group

# Starts a grandchild that inherits stdout and sleeps, says its pid, and ends (or waits).
PARENT = ("import subprocess, sys, time\n"
          "g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
          "print(g.pid, flush=True)\n"
          "if sys.argv[1] == 'wait':\n"
          "    time.sleep(120)\n")


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.slow
def test_a_child_that_ends_returns_and_takes_what_it_started_with_it():
    # subprocess.run(capture_output=True) would wait here for the grandchild's 120 s
    proc = run_as_group([sys.executable, "-c", PARENT, "end"], timeout=60)
    assert proc.returncode == 0, proc.stderr
    grandchild = int(proc.stdout.split()[0])
    psutil.wait_procs([p for p in psutil.process_iter() if p.pid == grandchild], timeout=5)
    assert _gone(grandchild), "the grandchild outlived the run"


@pytest.mark.slow
def test_a_child_past_its_timeout_fails_the_test_with_its_output_and_its_group_killed(tmp_path):
    with pytest.raises(AssertionError, match=r"did not end within 3 s \(its process group was killed\)") as err:
        run_as_group([sys.executable, "-c", PARENT, "wait"], timeout=3, cwd=tmp_path)
    grandchild = int(re.search(r"killed\):\n(\d+)", str(err.value)).group(1))
    psutil.wait_procs([p for p in psutil.process_iter() if p.pid == grandchild], timeout=5)
    assert _gone(grandchild), "the grandchild outlived the run"
