"""The only place that touches files and commands on behalf of the readers.

Every reader takes a ``root`` so the same code can be pointed at a fake
filesystem (the test fixtures) instead of ``/``.  Commands cannot be
re-rooted, so a fake root supplies their captured output as
``<root>/_commands/<name>.txt``.
"""
from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Sequence
from typing import Any

Runner = Callable[..., "subprocess.CompletedProcess[str]"]

# Captured command output lives here inside a fake root.
COMMANDS_DIR = "_commands"


def is_live(root: str) -> bool:
    return os.path.abspath(root) == "/"


def host_path(root: str, path: str) -> str:
    """Map an absolute machine path (``/proc/cpuinfo``) under ``root``."""
    return os.path.join(root, path.lstrip("/"))


def read_text(root: str, path: str) -> str | None:
    """Contents of a machine file, or None when it is absent or unreadable.

    Probes must never fail because one file is missing (containers hide a
    lot of /sys), so every error collapses to None.
    """
    try:
        with open(host_path(root, path), encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except (OSError, ValueError):
        return None


def list_dir(root: str, path: str) -> list[str]:
    try:
        return sorted(os.listdir(host_path(root, path)))
    except OSError:
        return []


def run_text(
    argv: Sequence[str],
    *,
    run: Runner = subprocess.run,
    timeout: float = 10.0,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
) -> tuple[int | None, str, str]:
    """Run a command and return ``(returncode, stdout, stderr)``.

    returncode is None when the command could not be started or timed out;
    partial output of a timed-out command is still returned because it is
    often the most useful part of the diagnosis.
    """
    try:
        # env=None and cwd=None are subprocess.run's own defaults: this process's.
        proc = run(list(argv), capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd)
    except subprocess.TimeoutExpired as exc:
        return None, _as_text(exc.stdout), _as_text(exc.stderr) + f"\ntimed out after {timeout:g}s"
    except (OSError, ValueError) as exc:
        return None, "", f"{type(exc).__name__}: {exc}"
    return proc.returncode, _as_text(proc.stdout), _as_text(proc.stderr)


def command_output(
    root: str,
    name: str,
    argv: Sequence[str],
    *,
    run: Runner = subprocess.run,
    timeout: float = 10.0,
    env: dict[str, str] | None = None,
) -> str | None:
    """stdout of a successful command on the live machine, or its captured
    copy ``_commands/<name>.txt`` inside a fake root."""
    if not is_live(root):
        return read_text(root, f"/{COMMANDS_DIR}/{name}.txt")
    rc, out, _ = run_text(argv, run=run, timeout=timeout, env=env)
    return out if rc == 0 else None


def _as_text(data: Any) -> str:
    if data is None:
        return ""
    if isinstance(data, bytes):
        return data.decode("utf-8", errors="replace")
    return str(data)


def last_line(text: str, *, limit: int = 300) -> str:
    """The last non-empty line of some output: usually the actual error."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1][:limit] if lines else ""
