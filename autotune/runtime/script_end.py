"""The end of a user's script in a process autotune starts: its training, and nothing after it.

A script the user runs goes on after ``trainer.train()`` or ``trainer.fit()``: it saves the
model (to a path of its own, maybe absolute: ``trainer.save_model("/models/final")``), writes
results, pushes, tests. None of that may run in the check, a trial, a gate's training or a
standalone pair: it would overwrite the user's real outputs with a tuning run's, or write
outside the output folder. So where the framework hands back from its training (``train()``
or ``fit()`` returns), the process autotune started goes no further:

- a timed run of ``run_tuned.py`` (``--report`` or ``--max-steps``; the standalone pairs are
  such runs) ends there, once its report is written (``end_process``): no ``finally`` or ``atexit`` of the script runs;
- a stepped script (``runtime.stepper``: the check, trials and gates) parks its thread there,
  and the worker, which holds the process, ends it.

``launch.sh`` and ``run_tuned.py`` run by the user, untimed, run the script whole.
This file is copied into ``tuned_runtime/`` beside the hooks; it imports nothing of autotune.
"""
from __future__ import annotations

import multiprocessing
import os
import shutil
import sys
import threading
from typing import NoReturn


def end_process(folder: str | None = None) -> NoReturn:
    """Leave now: the output flushed, this process's DataLoader workers (its multiprocessing
    children) ended, ``folder`` (the run's temporary outputs) removed, exit status 0."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    for child in multiprocessing.active_children():
        child.terminate()
    for child in multiprocessing.active_children():
        child.join(timeout=5)
    if folder:
        shutil.rmtree(folder, ignore_errors=True)
    os._exit(0)


def leave_ranks() -> None:
    """The script has returned, as one of several ranks: its ``atexit`` handlers run, then the
    process leaves without the interpreter's teardown, where tearing down gloo's threads aborts
    some runs (torch 2.13: "terminate called without an active exception", SIGABRT, in about one
    run in four of a 2-rank loop here) after a training that finished, and the job would be
    reported failed. One process leaves as usual."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return
    finalize()
    os._exit(0)


def finalize() -> None:
    """What an interpreter does at its end, less tearing down its modules: wait for its threads,
    run its ``atexit`` handlers, flush."""
    import atexit

    try:
        threading._shutdown()  # type: ignore[attr-defined]
    except Exception:
        pass
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass


def park() -> NoReturn:
    """Hold the calling thread here for the life of the process (the script's thread of a
    stepped script, once its training has returned: what follows it in the script never runs)."""
    threading.Event().wait()
    raise AssertionError("unreachable")
