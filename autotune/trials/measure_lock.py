"""One measuring process per machine: two tuners measuring at once disturb each
other's numbers (on a machine with few cores, a trial that shares them with another
measures a fraction of its own speed, and the search would rank noise). The lock is an
abstract Unix socket name: machine-wide (per network namespace), released by the kernel
when its holder dies, and no file is written. It is re-entrant within a process, so one
tuner can hold several live trials (verification) at once."""
from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator

# Runs confined to disjoint cores (cgroups, containers sharing a network namespace) do not
# disturb each other: each group may name its own lock.
LOCK_ENV = "AUTOTUNE_MEASURE_LOCK"
_suffix = os.environ.get(LOCK_ENV, "").encode()
NAME = b"\0autotune-measurement-lock" + (b":" + _suffix if _suffix else b"")
# The waiting room: whoever holds it is next. A process that runs trials back to back
# releases and re-takes the lock within milliseconds; without a turn to wait for, a
# second process polling for the lock could starve behind it.
NEXT = b"\0autotune-measurement-next" + (b":" + _suffix if _suffix else b"")

_guard = threading.Lock()
_socket: socket.socket | None = None
_depth = 0


def _default_notice(text: str) -> None:
    print(f"autotune: {text}", file=sys.stderr, flush=True)


def acquire(*, notice: Callable[[str], None] = _default_notice, poll_s: float = 0.5) -> None:
    global _socket, _depth
    with _guard:
        if _depth:
            _depth += 1
            return
        ticket = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        waited = has_ticket = False
        try:
            while True:
                if not has_ticket:
                    try:
                        ticket.bind(NEXT)
                        has_ticket = True
                    except OSError:
                        pass  # another process waits already: it goes first
                if has_ticket:
                    try:
                        sock.bind(NAME)
                        break
                    except OSError:
                        pass
                if not waited:
                    notice("another autotune process is measuring on this machine; waiting for "
                           "it to finish so that neither disturbs the other's measurements")
                    waited = True
                time.sleep(poll_s)
        finally:
            ticket.close()
        _socket, _depth = sock, 1


def release() -> None:
    global _socket, _depth
    with _guard:
        if not _depth:
            return
        _depth -= 1
        if not _depth and _socket is not None:
            _socket.close()
            _socket = None


@contextlib.contextmanager
def held(**kwargs) -> Iterator[None]:
    acquire(**kwargs)
    try:
        yield
    finally:
        release()
