"""Warm interpreters (this module: autotune's side; the server's is ``autotune.trials.warm_interpreter``):
trial processes forked from an interpreter that has already imported
torch, instead of each importing it afresh (2.7 s of CPU on a 2-core EPYC, 4.9 s with
``torch._dynamo``, which torch's optimizer imports on its first ``add_param_group``).

One server per process environment (``ForkServers``: the variables a process must have
before torch loads, its allocator's preload among them, are fixed when it starts, so
configurations that differ in them cannot share one). A server imports torch,
``torch._dynamo``, autotune's worker and the framework the task needs, and nothing of the
user's; then it forks a process per request. It starts no thread of its own, never touches
CUDA and never runs an operator, so nothing it forks inherits a CUDA context or a thread
pool (numpy's OpenBLAS starts a thread at import and stops it around a fork itself). A
forked process starts a new session, takes the request's standard streams, working
directory and environment, and runs the module as ``python -m`` would; it imports the
user's file itself, so it starts exactly as a fresh process does less the imports.

Not ``multiprocessing``'s forkserver: that is one server per interpreter, started with the
parent's environment, so a configuration under tcmalloc and one under glibc's allocator
could not both be forked from it; and its processes run a pickled function, not a module
with its own standard streams and session.

The server is never measured (it sleeps in ``select`` between requests) and ends with
autotune: its parent-death signal is SIGKILL, and each forked process's is too, so a
SIGKILL of autotune ends the server and with it every process it forked.
"""
from __future__ import annotations

import enum
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO


class Message(str, enum.Enum):
    """The ``"m"`` field of a line between autotune and a server (JSON, one a line)."""

    READY = "ready"      # server -> autotune: imported its modules (seconds)
    SPAWN = "spawn"      # autotune -> server: fork one (module, args, env, cwd, log)
    SPAWNED = "spawned"  # server -> autotune: forked (pid)
    EXITED = "exited"    # server -> autotune: a forked process ended (pid, code as Popen's)
    REFUSED = "refused"  # server -> autotune: could not fork (message)

    def __str__(self) -> str:
        return self.value


def write(fd: int, kind: Message, **fields: object) -> None:
    """The one writer of the protocol: a line of JSON, written whole (a pipe's write of
    under PIPE_BUF bytes is atomic)."""
    os.write(fd, (json.dumps({"m": str(kind), **fields}) + "\n").encode())


# Variables that differ from one forked process to the next and are read only after it
# starts: they are not part of a server's environment. The forked process enables
# faulthandler from its own environment (warm_interpreter), and inductor reads its cache
# folder when it compiles; at import only dynamo's package cache fixes that folder, and it
# is used only with TORCH_CACHING_PRECOMPILE=1 (experimental). So a run's check, which has
# neither, and its trials, which have both, fork from one server.
PER_PROCESS = ("TMPDIR", "AUTOTUNE_TRIAL_DIR", "PYTHONFAULTHANDLER", "TORCHINDUCTOR_CACHE_DIR")
# What every server imports; the task's framework comes on top (``preload``).
BASE_PRELOAD = ("torch", "torch._dynamo", "autotune.trials.worker")
# Idle servers kept (each holds some 300-400 MiB of imported modules), least recently used
# ended first.
MAX_SERVERS = 3
START_TIMEOUT_S = 300.0


def preload(framework: str | None) -> tuple[str, ...]:
    """The modules a server imports for a task whose framework is ``framework`` (a
    script's source module: transformers, lightning, pytorch_lightning; None: a model file)."""
    if framework == "transformers":
        return (*BASE_PRELOAD, "transformers", "transformers.trainer")
    return (*BASE_PRELOAD, framework) if framework else BASE_PRELOAD


class ForkServerError(RuntimeError):
    """A server could not start or fork: the caller starts a fresh process instead."""


class ForkedProcess:
    """A process a server forked, read like ``subprocess.Popen``: ``pid``, ``poll()``,
    ``wait()``, ``returncode`` (negative: the signal that ended it). Not autotune's child:
    its server reaps it and reports its exit code."""

    def __init__(self, server: ForkServer, pid: int) -> None:
        self.server, self.pid = server, pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.server.exit_code(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"forked process {self.pid}", timeout or 0.0)
            if self.server.closed:
                time.sleep(0.05)
            else:
                self.server.pump(0.05)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, signum)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class ForkServer:
    """autotune's handle on one server: started with ``env`` in ``cwd``, it imports
    ``modules`` and forks on ``spawn``."""

    def __init__(self, *, env: Mapping[str, str], cwd: Path, modules: Sequence[str], label: str,
                 log: Path, python: str = sys.executable) -> None:
        from autotune.trials import proctree

        self.modules = tuple(modules)
        self.log = open(log, "ab")  # noqa: SIM115 - the server's own errors, for its life
        # the label (the run's trial folder) is in its command line, and so in every forked
        # process's: whoever looks for a run's processes finds them by it
        self.proc = subprocess.Popen(
            [python, "-m", "autotune.trials.warm_interpreter", label, *self.modules],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, env=dict(env), cwd=str(cwd),
            start_new_session=True, preexec_fn=proctree.die_with_parent)
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self._in: IO[bytes] = self.proc.stdin
        self._out = self.proc.stdout.fileno()
        self._buffer = b""
        self._exits: dict[int, int] = {}
        self._spawned: list[int] = []
        self._refused: list[str] = []
        self._live: set[int] = set()
        self.ready_s: float | None = None
        self.closed = False

    def alive(self) -> bool:
        return not self.closed and self.proc.poll() is None

    def busy(self) -> bool:
        """Whether a process it forked may still run (ending the server would end it)."""
        self.pump()
        return bool(self._live)

    def pump(self, timeout: float = 0.0) -> None:
        """Read what the server has said, waiting up to ``timeout`` for a first line."""
        if self.closed:
            return
        ready, _, _ = select.select([self._out], [], [], timeout)
        while ready:
            chunk = os.read(self._out, 65536)
            if not chunk:
                break
            self._buffer += chunk
            ready, _, _ = select.select([self._out], [], [], 0)
        *lines, self._buffer = self._buffer.split(b"\n")
        for line in lines:
            msg = json.loads(line)
            kind = Message(msg["m"])
            if kind is Message.READY:
                self.ready_s = float(msg["seconds"])
            elif kind is Message.SPAWNED:
                self._spawned.append(int(msg["pid"]))
                self._live.add(int(msg["pid"]))
            elif kind is Message.EXITED:
                self._exits[int(msg["pid"])] = int(msg["code"])
                self._live.discard(int(msg["pid"]))
            elif kind is Message.REFUSED:
                self._refused.append(str(msg["message"]))

    def spawn(self, module: str, args: Sequence[str], *, env: Mapping[str, str], cwd: Path,
              log: Path) -> ForkedProcess:
        """Fork a process that runs ``python -m module args`` with ``env`` in ``cwd``, its
        output appended to ``log``; returns once it is forked (after the server's imports,
        for its first)."""
        try:
            self._in.write((json.dumps({"m": str(Message.SPAWN), "module": module, "args": list(args),
                                        "env": dict(env), "cwd": str(cwd), "log": str(log)}) + "\n").encode())
            self._in.flush()
        except OSError as exc:
            raise ForkServerError(f"the warm interpreter is gone ({exc})") from exc
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._spawned:
            if self._refused:
                raise ForkServerError(self._refused.pop(0))
            if not self.alive():
                raise ForkServerError(f"the warm interpreter exited with code {self.proc.returncode} "
                                      f"(its log: {self.log.name})")
            if time.monotonic() > deadline:
                self.close()
                raise ForkServerError(f"the warm interpreter did not fork within {START_TIMEOUT_S:.0f} s")
            self.pump(0.1)
        return ForkedProcess(self, self._spawned.pop(0))

    def exit_code(self, pid: int) -> int | None:
        self.pump()
        if pid in self._exits:
            return self._exits.pop(pid)
        if not self.alive():
            # the server is gone: its processes died with it (their parent-death signal);
            # one re-parented to autotune (a subreaper) is reaped here
            try:
                done, status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                return -signal.SIGKILL
            return os.waitstatus_to_exitcode(status) if done else None
        return None

    def close(self) -> None:
        """End the server; a process it forked that still runs ends with it."""
        if self.closed:
            return
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.closed = True
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                stream.close()
        self.log.close()


def server_environment(env: Mapping[str, str]) -> dict[str, str]:
    """The part of a process's environment that its server must have been started with."""
    return {k: v for k, v in env.items() if k not in PER_PROCESS}


class ForkServers:
    """The servers of a run, one per environment, started on first use; past
    ``MAX_SERVERS`` the least recently used ends. A server that failed once is not tried
    again: its environment's processes start fresh."""

    def __init__(self, *, folder: Path, python: str = sys.executable) -> None:
        self.folder, self.python = folder, python
        self._servers: OrderedDict[str, ForkServer] = OrderedDict()
        self._broken: dict[str, str] = {}

    def spawn(self, module: str, args: Sequence[str], *, env: Mapping[str, str], cwd: Path, log: Path,
              framework: str | None = None) -> ForkedProcess:
        """``ForkServer.spawn`` on the server for ``env``; raises ``ForkServerError`` where
        that server cannot start or fork (the caller starts the process fresh)."""
        modules = preload(framework)
        base = server_environment(env)
        key = json.dumps([str(cwd), modules, sorted(base.items())])
        if key in self._broken:
            raise ForkServerError(self._broken[key])
        server = self._servers.pop(key, None)
        if server is not None and not server.alive():
            server.close()
            server = None
        if server is None:
            self.folder.mkdir(parents=True, exist_ok=True)
            n = len(list(self.folder.glob("forkserver-*.log")))
            server = ForkServer(env=base, cwd=cwd, modules=modules, label=str(self.folder),
                                log=self.folder / f"forkserver-{n}.log", python=self.python)
        self._servers[key] = server
        # past MAX_SERVERS the least recently used idle ones end; one whose processes still
        # run (configurations held side by side) is kept: ending it would end them
        idle = [k for k, s in self._servers.items() if k != key and not s.busy()]
        for k in idle[:max(0, len(self._servers) - MAX_SERVERS)]:
            self._servers.pop(k).close()
        try:
            return server.spawn(module, args, env=env, cwd=cwd, log=log)
        except ForkServerError as exc:
            self._servers.pop(key, None)
            server.close()
            self._broken[key] = str(exc)
            raise

    def adopt(self, other: ForkServers) -> None:
        """Take over ``other``'s idle servers of this interpreter: a run's trials fork from the
        warm interpreter its check started (``shared``) where their environment is the
        check's, rather than import torch again (about 3 CPU-seconds)."""
        if other.python != self.python:
            return
        for key, server in list(other._servers.items()):
            if key not in self._servers and server.alive() and not server.busy():
                self._servers[key] = other._servers.pop(key)

    def pids(self) -> list[int]:
        """The servers' own processes."""
        return [server.proc.pid for server in self._servers.values() if server.alive()]

    def close(self) -> None:
        while self._servers:
            self._servers.popitem()[1].close()


_SHARED: list[ForkServers] = []


def shared() -> ForkServers:
    """This process's own servers, for what it starts outside a run's trial runner (the
    contract checks: a test session or a notebook checks many files): ended at its exit."""
    if not _SHARED:
        import atexit
        import shutil
        import tempfile

        folder = Path(tempfile.mkdtemp(prefix="autotune-forkservers-"))
        _SHARED.append(ForkServers(folder=folder))
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        atexit.register(_SHARED[0].close)
    return _SHARED[0]
