"""What a trial process leaves to read: its log (capped, so a print in a data set's
``__getitem__`` cannot fill the disk, and read from the end) and its event file."""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

from autotune.runtime.ranks import RANKS_PREFIX
from autotune.trials.events import TrialEvent, read_event

# A trial's log past LOG_CAP_BYTES keeps its first and last LOG_KEEP_BYTES: a print in
# __getitem__ would otherwise fill the disk.
LOG_CAP_BYTES = 32 * 2**20
LOG_KEEP_BYTES = 2**20


def cap_log(path: Path, *, cap: int, keep: int) -> int:
    """Cut the middle out of a log grown past ``cap``: its first and last ``keep`` bytes
    stay, with a line saying how much went. The trial's processes hold the log open
    with O_APPEND, so they go on writing after the cut (what they write during the cut
    itself may be lost). Returns the bytes removed."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return 0
    if size <= cap:
        return 0
    with open(path, "r+b") as f:
        f.seek(size - keep)
        tail = f.read(keep)
        tail = tail[tail.find(b"\n") + 1:] or tail  # from a line's start
        f.seek(keep)
        f.truncate()
        f.seek(0, os.SEEK_END)
        removed = size - keep - len(tail)
        marker = f"\n[autotune: {removed:,} bytes of this log were cut here]\n".encode()
        f.write(marker + tail)
    return removed


class EventReader:
    """The JSON lines a trial's worker appends to its event file, read as they arrive
    (a line still being written waits for the next read), as their events; a line of a
    kind this tuner does not know is passed over."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset, self.buffer = path, 0, b""

    def read(self) -> list[TrialEvent]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                chunk = f.read()
        except FileNotFoundError:
            return []
        self.offset += len(chunk)
        self.buffer += chunk
        *lines, self.buffer = self.buffer.split(b"\n")
        out = []
        for line in lines:
            try:
                event = read_event(json.loads(line))
            except json.JSONDecodeError:
                continue
            if event is not None:
                out.append(event)
        return out


def tail(path: Path, lines: int = 30, *, max_bytes: int = 65536) -> str:
    """The last ``lines`` lines, read from the end: a log can be gigabytes."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - max_bytes))
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


# What the runtime's start_ranks prints when a rank dies of a signal.
RANK_SIGNAL = re.compile(re.escape(RANKS_PREFIX) + r"rank \d+ was killed by (SIG\w+)")


def signal_from_log(log: str) -> str | None:
    match = RANK_SIGNAL.search(log)
    return match.group(1) if match else None
