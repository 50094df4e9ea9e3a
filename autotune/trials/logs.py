"""What a trial process leaves to read: its log (capped, so a print in a data set's
``__getitem__`` cannot fill the disk, and read from the end) and its event file."""
from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from autotune.runtime.process_facts import ProcessFacts
from autotune.runtime.ranks import RANKS_PREFIX
from autotune.schemas import typed
from autotune.trials.events import EVENT_TYPES, DoneEvent, FactsEvent, SetupEvent, TrialEvent
from autotune.trials.protocol import Event, Mode

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


STAMP = ("e", "rank", "t")


def read_event(data: Mapping[str, object]) -> TrialEvent | None:
    """A line of events.jsonl as its event; None for a kind this tuner does not know (a
    newer worker's: nothing here acts on it). A null reads as the field's default where
    it has one (a stand-in worker's lines carry few fields); a field the tuner acts on
    (a window's rate, an error's kind) must be there, of its type (pydantic's
    ValidationError names it)."""
    try:
        kind = EVENT_TYPES[Event(data.get("e"))]
    except ValueError:
        return None
    fields = _set(kind, data)
    # the parts a line carries flat among its fields
    if kind is SetupEvent and "threads" in data:
        fields["process"] = typed.read(ProcessFacts, _set(ProcessFacts, data))
    elif kind is FactsEvent:
        fields = {"facts": {k: v for k, v in data.items() if k not in STAMP},
                  **{k: v for k, v in fields.items() if k in STAMP}}
    elif kind is DoneEvent:  # the mode is not on the line: what it carries says
        fields["mode"] = (Mode.PROFILE if "step_profile" in data else Mode.MEASURE if "value" in data
                          else Mode.QUALITY if "metric" in data else Mode.TRAJECTORY)
    return typed.read(kind, fields)


def _set(kind: type[Any], data: Mapping[str, object]) -> dict[str, object]:
    """``data`` less the nulls of fields that have a default other than None."""
    defaulted = _defaulted(kind)
    return {k: v for k, v in data.items() if not (v is None and k in defaulted)}


_DEFAULTED: dict[type[Any], frozenset[str]] = {}


def _defaulted(kind: type[Any]) -> frozenset[str]:
    # once a type (functools.cache will not type-check on a type): the tuner reads every
    # line a trial writes while it measures
    if kind not in _DEFAULTED:
        _DEFAULTED[kind] = frozenset(f.name for f in dataclasses.fields(kind)
                                     if f.default is not None and (f.default is not dataclasses.MISSING
                                                                   or f.default_factory is not dataclasses.MISSING))
    return _DEFAULTED[kind]


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
