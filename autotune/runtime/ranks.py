"""A rank process's first steps, taken before torch is imported: start the ranks, pin the cores.

Stdlib only. ``bootstrap()`` is the first call of whoever starts a rank process (the
trial worker, train_tuned.py). With ``TUNED_NPROCS=n`` and no rank yet, the process starts
its own command line n times as the ranks and exits as they did (``start_ranks``): it
never imports torch. Then core pinning, which must come before torch starts its OpenMP
pool: the launcher passes each local rank's cores in ``TUNED_CPUS_PER_RANK`` ("0-3;4-7":
one list per local rank). A rank that torchrun started is tied to its agent first
(``die_with_agent``).
"""
from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

RANKS_PREFIX = "tuned ranks: "


def bootstrap() -> None:
    """Start the ranks (and never return) when this process is their launcher; else pin
    this rank's cores (and, under torchrun, tie this rank to its agent). Call it before
    anything imports torch."""
    start_ranks()
    if os.environ.get("TORCHELASTIC_RUN_ID"):
        die_with_agent()
    pin_local_rank()


def die_with_agent() -> None:
    """A rank that torchrun started ends with its agent. torchrun starts each rank in a
    session of its own, so a killed agent (SIGKILL, an out-of-memory kill) would leave its
    node's ranks training on, orphaned, with the other nodes: a job that no agent reports
    on and that never ends. Ended with their agent, they close their connections, and the
    other nodes' ranks fail on their next collective. (No check that the agent is still
    there: in a container torchrun may itself be PID 1, the parent an orphan would have.)"""
    _die_with_parent()


def _parse_cpu_list(text: str) -> set[int]:
    """CPU numbers of a list such as "0-3,8,10-11"."""
    cpus: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def pin_local_rank() -> set[int] | None:
    """Pin this process to its local rank's cores from ``TUNED_CPUS_PER_RANK``; returns
    them, or None when the variable is unset and nothing is pinned."""
    spec = os.environ.get("TUNED_CPUS_PER_RANK")
    if not spec:
        return None
    per_rank = spec.split(";")
    rank = int(os.environ.get("LOCAL_RANK", "0"))
    cpus = _parse_cpu_list(per_rank[rank % len(per_rank)])
    os.sched_setaffinity(0, cpus)
    return cpus


def _die_with_parent() -> None:
    """In a rank, before it runs: it must not outlive the launcher that started it."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def start_ranks() -> None:
    """Several ranks on this machine (``TUNED_NPROCS`` > 1, no ``RANK`` yet): start this
    process's own command line once per rank, wait for them, and leave with their exit
    code; this process never trains. The ranks meet through a file store in a fresh
    temporary folder (``TUNED_STORE``) and talk over the interface the launcher names
    (``GLOO_SOCKET_IFNAME``, loopback): torchrun --standalone's TCP stores listen on
    every interface, and any host on the network could write into them. A rank that
    fails ends the others, as under torchrun; SIGTERM, SIGINT and SIGHUP are passed on."""
    n = int(os.environ.get("TUNED_NPROCS") or 1)
    if n <= 1 or "RANK" in os.environ:
        return
    folder = tempfile.mkdtemp(prefix="tuned-ranks-")
    argv = [sys.executable, *sys.orig_argv[1:]]
    ranks = []
    for rank in range(n):
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(n),
               "LOCAL_WORLD_SIZE": str(n), "TUNED_STORE": os.path.join(folder, "store")}
        env.setdefault("OMP_NUM_THREADS", "1")  # torchrun's default for several ranks
        ranks.append(subprocess.Popen(argv, env=env, preexec_fn=_die_with_parent))

    def forward(signum: int, frame: object) -> None:
        for p in ranks:
            if p.poll() is None:
                p.send_signal(signum)

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, forward)
    code = 0
    try:
        while True:
            codes = [p.poll() for p in ranks]
            failed = next(((r, c) for r, c in enumerate(codes) if c not in (None, 0)), None)
            if failed is not None:
                rank, c = failed
                what = (f"was killed by {signal.Signals(-c).name}" if c < 0
                        else f"exited with code {c}")
                print(f"{RANKS_PREFIX}rank {rank} {what}; ending the others", file=sys.stderr,
                      flush=True)
                code = 128 - c if c < 0 else c
                break
            if all(c == 0 for c in codes):
                break
            time.sleep(0.05)
        for p in ranks:
            if p.poll() is None:
                p.terminate()
        deadline = time.monotonic() + 10
        for p in ranks:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
