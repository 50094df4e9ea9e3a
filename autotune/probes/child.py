"""Running probe code in a child interpreter.

Anything that imports torch or its extensions runs in a child: torch costs ~2 s to
import, a broken extension can segfault, and a mismatched IPEX calls exit() on import.
"""
from __future__ import annotations

import sys

from . import _io

# Children bind only to loopback: gloo and NCCL pick their listening
# interface from these, and the store is in-memory (HashStore) because
# TCPStore's server listens on every interface whatever host it is given.
LOOPBACK_ENV = {"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo"}


def child_python_argv(script: str, *, python: str = sys.executable) -> list[str]:
    """The command line that runs ``script`` in a fresh interpreter."""
    # -P keeps the current directory off sys.path, so a stray torch.py in
    # the user's cwd cannot shadow the real package.
    flags = ["-P"] if sys.version_info >= (3, 11) else []
    return [python, *flags, "-c", script]


def child_failure(returncode: int | None, stderr: str) -> str | None:
    """Why a probe child failed (its exit status and last stderr line), or None if it
    exited with 0; a return code of None means it did not finish."""
    if returncode == 0:
        return None
    tail = _io.last_line(stderr)
    what = "probe subprocess did not finish" if returncode is None else f"probe subprocess exited with {returncode}"
    return f"{what}: {tail}" if tail else what
