"""The metric a plain loop prints (``--metric``), read as its script prints it.

A plain loop has no evaluation autotune could call between two steps: its quality is what
the script prints (``val_acc 0.6543``), when the script chooses to print it. So a gate's
scored training of a loop is the script itself, run in its trial process with the
configuration's knobs and seed, to the first print of the metric once the training has
taken the steps the gate asked for (to the script's end where nothing is printed later);
what it printed before are its scores along the way, at the steps it printed them after.
The script's thread stops at that print (``Stepper.training_over``): what follows it in the
script (a test set, an upload) never runs in a process autotune started. Where the script
trains to its end, what it does there is stopped at its first write outside the trial's
folder (``guard_writes``: Python's audit hook on ``open`` and a wrapper of ``torch.save``,
whose file torch's C++ writer opens): a run to the print never saves over the user's files.

The script's ``sys.stdout`` and ``sys.stderr`` are read through while it writes to them
(``_ReadThrough``): everything still reaches the trial's log as it would have.
"""
from __future__ import annotations

import os
import re
import sys
import tempfile
import threading
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from autotune.runtime.stepper import Stepper


class PrintedScores:
    """The numbers a script printed on lines that ``pattern`` matches (its group, or the whole
    match), turned so that higher is better, by the optimizer steps taken before each; and
    where to stop it (``stop_after``: the first print after so many steps)."""

    def __init__(self, pattern: str, *, greater_is_better: bool, stepper: Stepper) -> None:
        self.pattern = pattern
        self.regex = re.compile(pattern)
        self.sign = 1.0 if greater_is_better else -1.0
        self.stepper = stepper
        self.scores: list[tuple[int, float]] = []
        self.unreadable: list[str] = []  # matched lines whose number did not read as one
        self.stop_after: int | None = None
        # this process's: a DataLoader worker forked from the script's thread inherits the hooks,
        # and must never be stopped by them
        self.pid = os.getpid()
        self.wrote: tuple[str, int] | None = None  # the write outside the trial's folder it stopped at, and its step
        self._allowed: tuple[str, ...] = ()
        self._lock = threading.Lock()

    def install(self) -> None:
        """Read the script's output from now on (before its thread starts)."""
        sys.stdout = _ReadThrough(sys.stdout, self)
        sys.stderr = _ReadThrough(sys.stderr, self)

    def guard_writes(self, folder: str) -> None:
        """From now on, the script's first write outside ``folder`` (and the caches torch and
        Python keep: the temporary folder, ``~/.cache``, ``__pycache__``) ends its training there."""
        import torch

        self._allowed = tuple(os.path.realpath(p) + os.sep for p in (
            folder, tempfile.gettempdir(), os.path.expanduser("~/.cache"), os.path.expanduser("~/.triton"), "/dev"))
        sys.addaudithook(self._audit)
        save = torch.save

        def guarded_save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> Any:
            if isinstance(f, (str, os.PathLike)):
                self._writes(os.fspath(f))
            return save(obj, f, *args, **kwargs)

        torch.save = guarded_save

    def _audit(self, event: str, args: tuple[Any, ...]) -> None:
        if event != "open" or not args or not isinstance(args[0], (str, bytes, os.PathLike)):
            return
        mode, flags = (args[1] if len(args) > 1 else None), (args[2] if len(args) > 2 else 0)
        writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
            isinstance(flags, int) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC))
        if writing:
            path = os.fsdecode(args[0])
            self._writes(path)

    def _writes(self, path: str) -> None:
        if (threading.current_thread() is not self.stepper.thread or self.wrote is not None
                or os.getpid() != self.pid):
            return
        real = os.path.realpath(path)
        if real.startswith(self._allowed) or f"{os.sep}__pycache__{os.sep}" in real:
            return
        self.wrote = (path, len(self.stepper.losses))
        self.stepper.training_over()  # parks the script's thread before it writes

    def line(self, text: str) -> None:
        found = self.regex.search(text)
        if found is None or os.getpid() != self.pid:
            return
        raw = found.group(1) if self.regex.groups else found.group(0)
        try:
            value = float(raw.strip().rstrip(",;:%)"))
        except ValueError:
            self.unreadable.append(text.strip()[:200])
            return
        with self._lock:
            steps = len(self.stepper.losses)
            self.scores.append((steps, self.sign * value))
        if (self.stop_after is not None and steps >= self.stop_after
                and threading.current_thread() is self.stepper.thread):
            for stream in (sys.stdout, sys.stderr):
                stream.flush()
            self.stepper.training_over()  # parks the script's thread here

    def missing(self, steps: int) -> str:
        """Why a training of ``steps`` steps gave no score."""
        if self.wrote is not None:
            path, step = self.wrote
            return (f"the script writes {path} after {step} steps, before it printed a line --metric "
                    f"{self.pattern!r} matches; no process autotune starts writes outside its output folder, so its "
                    "training ended there. Print the metric before the script saves (or put the saving behind a "
                    "flag), then run autotune again")
        if self.unreadable:
            return (f"--metric {self.pattern!r} matched {self.unreadable[-1]!r}, but what it captured is not a "
                    r"number: put a group around the number alone (--metric 'val_acc (\S+)')")
        return (f"the script printed no line that --metric {self.pattern!r} matches in its {steps} steps and what "
                "followed them (its output is in the trial's log): name a line it prints after its evaluation, "
                "the number in a group")


class _ReadThrough:
    """A text stream that writes through to ``stream`` and hands each whole line to ``scores``."""

    def __init__(self, stream: IO[str], scores: PrintedScores) -> None:
        self._stream, self._scores, self._pending = stream, scores, ""

    def write(self, text: str) -> int:
        written = self._stream.write(text)
        self._pending += text
        if "\n" in self._pending:
            *lines, self._pending = self._pending.split("\n")
            for line in lines:
                self._scores.line(line)
        return written

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)
