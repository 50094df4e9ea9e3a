"""A real PostgreSQL server for the shared-study tests: Debian's package, started in a
temporary data directory, reachable only through a Unix socket in that directory (no TCP
port at all), with a password, stopped and removed after.

The server refuses to run as root (CI runs as root): there it runs as the ``postgres``
user the Debian package creates, in a folder handed to that user.
"""
from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

PASSWORD = "s3cret-Pa55"  # the tests assert this never appears in what autotune writes
USER = "autotune"


def server_bin() -> Path | None:
    """The folder of Debian's initdb and pg_ctl (newest version), or None when absent."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                   key=lambda p: int(Path(p).parts[-3]) if Path(p).parts[-3].isdigit() else 0)
    return Path(found[-1]).parent if found else None


def _as_server_user(argv: list[str]) -> list[str]:
    if os.geteuid() != 0:
        return argv
    return ["runuser", "-u", "postgres", "--", *argv]


@contextlib.contextmanager
def running_server() -> Iterator[str]:
    """A started server; yields its SQLAlchemy URL (with the password)."""
    import pytest

    bin_dir = server_bin()
    if bin_dir is None:  # a new user's machine: .ci/run installs it
        pytest.skip("PostgreSQL is not installed (Debian: apt-get install postgresql): the shared-study "
                    "tests start a real server")
    # Short: a Unix socket's path has at most 107 bytes.
    folder = Path(tempfile.mkdtemp(prefix="atpg-"))
    data, sockets = folder / "data", folder / "sock"
    sockets.mkdir()
    pwfile = folder / "pw"
    pwfile.write_text(PASSWORD + "\n")
    if os.geteuid() == 0:
        owner = pwd.getpwnam("postgres")
        for path in (folder, sockets, pwfile):
            os.chown(path, owner.pw_uid, owner.pw_gid)
    log = folder / "server.log"
    try:
        subprocess.run(_as_server_user([str(bin_dir / "initdb"), "-D", str(data), "-U", USER,
                                        "--auth=scram-sha-256", f"--pwfile={pwfile}",
                                        "--no-sync", "-E", "UTF8"]),
                       check=True, capture_output=True, text=True, timeout=120)
        subprocess.run(_as_server_user([
            str(bin_dir / "pg_ctl"), "-D", str(data), "-l", str(log), "-w", "-t", "60", "start",
            "-o", f"-c listen_addresses='' -k {sockets} -c fsync=off -c max_connections=200"]),
            check=True, capture_output=True, text=True, timeout=120)
        yield f"postgresql+psycopg://{USER}:{PASSWORD}@/postgres?host={sockets}"
    finally:
        subprocess.run(_as_server_user([str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "immediate",
                                        "stop"]), capture_output=True, timeout=60)
        shutil.rmtree(folder, ignore_errors=True)
