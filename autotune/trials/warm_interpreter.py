"""The warm interpreter's side of ``autotune.trials.forkserver``: ``python -m
autotune.trials.warm_interpreter LABEL MODULE...`` imports the modules, then forks a process
per request on stdin until stdin closes, and reports each fork and each exit on stdout
(``forkserver.Message``). The label (the run's trial folder) is only there to be seen in its
command line."""
from __future__ import annotations

import gc
import json
import os
import select
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from autotune.runtime import script_end
from autotune.trials.forkserver import Message, write


def serve(modules: Sequence[str]) -> None:
    """Import ``modules``, then fork a process per request on stdin until stdin closes;
    report each fork and each exit on stdout."""
    from autotune.runtime import ranks
    from autotune.trials import proctree

    proctree.die_with_parent()
    if int(os.environ.get("TUNED_NPROCS") or 1) <= 1:
        ranks.pin_local_rank()  # before torch's OpenMP runtime reads the cores, as a fresh start does
    started = time.monotonic()
    import importlib

    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as exc:  # not installed here: what forks imports it itself, or fails as it would
            print(f"warm interpreter: not preloaded: {name}: {exc}", file=sys.stderr, flush=True)
    # What was imported lives as long as every process forked from here: frozen, the cyclic
    # collector never walks it again. A warm trial collects twice after each configuration
    # (``Session.release``), and with torch and torch._dynamo loaded a full collection walks
    # about 300,000 objects (0.14 s on a 2-core EPYC); frozen, it takes microseconds. Its
    # untouched object headers also stay shared with this process after the fork.
    gc.freeze()
    out = sys.stdout.fileno()
    write(out, Message.READY, seconds=round(time.monotonic() - started, 3))
    refusal = _cuda_touched()
    wake_r, wake_w = os.pipe()
    server = os.getpid()  # what a forked process checks its parent against
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes the select below
    buffer = b""
    while True:
        ready, _, _ = select.select([0, wake_r], [], [])
        if wake_r in ready:
            os.read(wake_r, 4096)
        _reap(out)
        if 0 not in ready:
            continue
        chunk = os.read(0, 65536)
        if not chunk:
            return  # autotune closed its end: done
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            request = json.loads(line)
            if refusal:
                write(out, Message.REFUSED, message=refusal)
                continue
            try:
                pid = os.fork()
            except OSError as exc:
                write(out, Message.REFUSED, message=f"fork failed: {exc}")
                continue
            if pid == 0:
                _become(request, keep=(wake_r, wake_w), server=server)
            write(out, Message.SPAWNED, pid=pid)


def _cuda_touched() -> str | None:
    """Why this interpreter must not fork, or None: the CUDA driver, once loaded (an import
    that asked ``torch.cuda.is_available()``), does not survive a fork, and a forked process
    would fail its first CUDA call."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    if "libcuda.so" in maps:
        return "the CUDA driver was loaded while the warm interpreter imported its modules"
    return None


def _reap(out: int) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        write(out, Message.EXITED, pid=pid, code=os.waitstatus_to_exitcode(status))


def _become(request: dict, *, keep: tuple[int, ...], server: int) -> None:
    """In the forked process: become what ``python -m MODULE ARGS`` started with the
    request's environment, streams and folder would be; never returns. ``server``: the
    server's pid, read before the fork (read after it, a server that died in between would
    read as the new parent, and this process would outlive it)."""
    import faulthandler
    import runpy
    import tempfile

    from autotune.trials import proctree

    code = 1
    try:
        os.setsid()
        proctree.die_with_parent()
        if os.getppid() != server:
            os._exit(1)  # the server died before the signal was set
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for fd in keep:
            os.close(fd)
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(null)
        os.close(log)
        os.chdir(request["cwd"])
        _retitle([sys.executable, "-m", request["module"], *request["args"]])  # while the C environ is whole
        os.environ.clear()
        os.environ.update(request["env"])
        tempfile.tempdir = None  # torch's imports read it: the request's TMPDIR, as a fresh start would
        sys.orig_argv = [sys.executable, "-m", request["module"], *request["args"]]
        sys.argv = [request["module"], *request["args"]]
        if os.environ.get("PYTHONFAULTHANDLER"):
            faulthandler.enable()
        try:
            runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as exc:
            code = _exit_code(exc.code)
        except BaseException:
            import traceback

            traceback.print_exc()
            code = 1
        script_end.finalize()
    finally:
        os._exit(code)


def _retitle(argv: Sequence[str]) -> None:
    """Its command line as ps, top and a search of the process table show it: the one a fresh
    start would have had, not the server's."""
    try:
        import setproctitle
    except ImportError:
        return
    setproctitle.setproctitle(" ".join(argv))


def _exit_code(value: object) -> int:
    if value is None:
        return 0
    if isinstance(value, int):
        return value
    print(value, file=sys.stderr)
    return 1


if __name__ == "__main__":
    serve(sys.argv[2:])  # argv[1]: the label
