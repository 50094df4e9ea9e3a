"""The output folder: a folder that cannot be written is refused with a message."""
from __future__ import annotations

import os

import pytest

from autotune import outdir
from autotune.errors import UsageError


def test_a_folder_where_the_lock_cannot_be_written_is_refused_with_a_message(tmp_path, monkeypatch):
    # As root (CI) permission bits do not stop writes; a read-only mount does, as here.
    real_open = os.open

    def read_only(path, flags, *args):
        if str(path).startswith(str(tmp_path)) and flags & os.O_CREAT:
            raise PermissionError(30, "Read-only file system")
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", read_only)
    with pytest.raises(UsageError, match="cannot write in the output folder"), outdir.exclusive(tmp_path):
        pass


def test_a_second_run_on_a_busy_folder_is_refused(tmp_path):
    with outdir.exclusive(tmp_path), pytest.raises(UsageError, match="in use by another autotune run"):
        with outdir.exclusive(tmp_path):
            pass


def test_a_users_own_folder_is_refused_unless_forced(tmp_path):
    (tmp_path / "launch.sh").write_text("# the user's own\n")
    with pytest.raises(UsageError, match="not made by autotune.*--force"):
        outdir.check_ours(tmp_path, force=False)
    outdir.check_ours(tmp_path, force=True)
    outdir.check_ours(tmp_path / "new", force=False)  # not there yet: autotune makes it
    empty = tmp_path / "empty"
    empty.mkdir()
    outdir.check_ours(empty, force=False)
    with outdir.exclusive(empty):  # once autotune has used it, it is autotune's
        (empty / "best_config.json").write_text("{}")
    outdir.check_ours(empty, force=False)
