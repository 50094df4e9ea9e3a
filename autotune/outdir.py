"""The output folder: created, checked writable, held by one run at a time, and its
files written whole."""
from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from autotune.errors import UsageError

LOCK_NAME = ".autotune.lock"


def check_ours(path: Path, *, force: bool) -> None:
    """An existing folder that holds files and no trace of autotune is the user's: writing
    launch.sh and best_config.json into it would replace theirs without a word."""
    if force or not path.is_dir() or (path / LOCK_NAME).exists():
        return
    if any(path.iterdir()):
        raise UsageError(f"--out {path}: the folder exists and was not made by autotune; its "
                         "launch.sh, train_tuned.py (with train_tuned.json and tuned_runtime/) and "
                         "best_config.json would be replaced. Give a new folder, or --force to write "
                         "into this one.")


def write_atomically(path: Path, content: str | bytes, *, mode: int = 0o644) -> None:
    """A crash mid-write leaves the previous file, never half of the new one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    if isinstance(content, bytes):
        tmp.write_bytes(content)
    else:
        tmp.write_text(content)
    tmp.chmod(mode)
    os.replace(tmp, path)


def prepare(path: Path) -> Path:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--out {path}: cannot create the output folder ({exc.strerror}). "
                         "Choose a folder you can write to.") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise UsageError(f"--out {path}: the output folder is not writable. "
                         "Choose a folder you can write to.")
    return path


@contextlib.contextmanager
def exclusive(path: Path) -> Iterator[None]:
    """Two runs on one folder would share a study and measure at once: refuse the second."""
    try:
        fd = os.open(path / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise UsageError(f"--out {path}: cannot write in the output folder ({exc.strerror}). "
                         "Choose a folder you can write to.") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 64).decode(errors="replace").strip() or "another process"
            raise UsageError(
                f"{path} is in use by another autotune run (pid {holder}). Wait for it to "
                "finish, or give this run its own --out folder."
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        yield
    finally:
        os.close(fd)
