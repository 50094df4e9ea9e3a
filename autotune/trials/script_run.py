"""One run of an emitted launch.sh, as verification's standalone pairs start it: its own
process session, a temporary folder of its own, a report and a log in its folder.

A run may be started ahead of its turn (``hold``): the script then sets up (interpreter,
imports, ``build_dataset``, ``build_model``, the CUDA context) and waits before its first
step until ``finish`` lets it go (train_tuned.py's ``--start-after``), so that its setup
overlaps another run's training and its own training overlaps nothing.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from autotune.trials import launch, logs, measure_lock, proctree
from autotune.trials.script_report import ScriptReport

# train_tuned.py's option: wait before the first step until this file exists.
START_AFTER = "--start-after"


class ScriptProcess:
    """A started run of ``launcher`` for ``steps`` steps, from ``cwd``; its report and log
    go into ``workdir``. ``timeout_s`` counts from when it is let go. Without evaluate():
    the runs compared are timed, and two configurations cross different numbers of epoch
    ends in the same time. ``extra``: more arguments for the script (``--profile``)."""

    def __init__(self, launcher: Path, *, steps: int, workdir: Path, timeout_s: float, cwd: Path,
                 env: Mapping[str, str], hold: bool = False, extra: Sequence[str] = ()) -> None:
        self.launcher, self.timeout_s = launcher, timeout_s
        workdir = workdir.absolute()
        workdir.mkdir(parents=True, exist_ok=True)
        self.report = workdir / "script-report.json"
        self.report.unlink(missing_ok=True)
        self.log = workdir / "script-log.txt"
        self.go = workdir / "go" if hold else None
        if self.go is not None:
            self.go.unlink(missing_ok=True)
        self.tmp = tempfile.mkdtemp(prefix="autotune-script-")  # as a trial's (TrialRunner.start)
        argv = ["bash", str(launcher.absolute()), "--max-steps", str(steps), "--no-checkpoint",
                "--no-evaluate", "--log-every", str(max(1, steps)), "--report", str(self.report),
                *([START_AFTER, str(self.go)] if self.go is not None else []), *extra]
        with open(self.log, "wb") as out:  # the child writes to its own copy of it
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=str(cwd),
                                         stdin=subprocess.DEVNULL, start_new_session=True,
                                         env={**launch.without_distributed(os.environ), **env, "TMPDIR": self.tmp})
        self.ended = False

    def finish(self) -> ScriptReport:
        """Let it train (alone: the measurement lock held) and wait for its report;
        RuntimeError, with the log's last lines, where it failed."""
        with measure_lock.held():
            if self.go is not None:
                self.go.touch()
            try:
                self.proc.wait(timeout=self.timeout_s)
            except subprocess.TimeoutExpired:
                pass
            finally:
                self.cancel()
        if self.proc.returncode != 0 or not self.report.exists():
            tail = logs.tail(self.log, 15)
            raise RuntimeError(f"{self.launcher.name} failed (exit code {self.proc.returncode}):\n{tail}")
        return ScriptReport.from_json(json.loads(self.report.read_text()))

    def cancel(self) -> None:
        """End it, with whatever it started, and clear its temporary folder."""
        if self.ended:
            return
        self.ended = True
        proctree.kill_tree(self.proc.pid)
        self.proc.wait()
        shutil.rmtree(self.tmp, ignore_errors=True)
