"""Process trees: a trial is a tree (the ranks' launcher, ranks, DataLoader workers, compile
workers) whose members may sit in different process groups, so ending a trial means
walking the tree, not signalling one group."""
from __future__ import annotations

import ctypes
import os
import signal
import time
from collections.abc import Collection, Mapping
from pathlib import Path

import psutil

# The folder that holds the autotune package, whether or not it is installed.
PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])
_PR_SET_CHILD_SUBREAPER = 36
_PR_SET_PDEATHSIG = 1


def become_subreaper() -> bool:
    """Orphans of our trials re-parent to us instead of init, so we can still find
    and end them after their parent died."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def die_with_parent() -> None:
    """Ask the kernel to SIGKILL this process when its parent dies: a trial must not
    outlive a tuner that was killed (SIGKILL can't be caught to clean up). Not inherited
    across fork, so each level of the tree (trial, its ranks) sets it itself."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def snapshot(pid: int) -> dict[int, float]:
    """pid -> start time of a process and its descendants, to find them again after
    the root has exited and they were re-parented."""
    out: dict[int, float] = {}
    try:
        procs = [psutil.Process(pid), *descendants(pid)]
    except psutil.Error:
        return out
    for p in procs:
        try:
            out[p.pid] = p.create_time()
        except psutil.Error:
            pass
    return out


def kill_known(members: dict[int, float]) -> None:
    """SIGKILL the processes of a snapshot that are still the same processes."""
    procs = []
    for pid, started in members.items():
        try:
            p = psutil.Process(pid)
            if p.create_time() == started:
                procs.append(p)
        except psutil.Error:
            pass
    _kill_all(procs)


def _kill_all(procs: list[psutil.Process]) -> None:
    for p in procs:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(procs, timeout=2)


def descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def _tree(pid: int) -> list[psutil.Process]:
    try:
        return [psutil.Process(pid), *descendants(pid)]
    except psutil.Error:
        return []


def tree_rss(pid: int) -> int:
    """The resident sets of a process and all its descendants, summed, in bytes: cheap (a
    counter each), and never less than what they hold (``tree_memory``), which it
    overstates by each page they share, once per process sharing it."""
    total = 0
    for p in _tree(pid):
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total


def tree_memory(pid: int) -> int:
    """What a process and all its descendants hold, in bytes, each page counted once: their
    proportional set sizes summed (PSS: a page that n processes map counts 1/n in each).
    Forked DataLoader workers share their parent's pages copy-on-write, so a data set held
    in memory is resident in each: summed resident sets count it once per worker, 72 times
    on 8 ranks with 8 workers each. Costly: the kernel walks every resident page for it
    (``TreeMemory`` bounds how often)."""
    total = 0
    for p in _tree(pid):
        try:
            total += _proportional(p)
        except psutil.Error:
            pass
    return total


def _proportional(p: psutil.Process) -> int:
    """``p``'s PSS (/proc/PID/smaps_rollup on Linux); its resident set where that is not to be
    had: another OS (which gives USS at most), or a process whose smaps we may not read.
    Not USS, which leaves out every shared page (the data set the workers share among
    them): RSS overstates, at worst stopping a trial early; USS would understate, leaving
    the machine to the kernel's OOM killer."""
    try:
        pss = getattr(p.memory_full_info(), "pss", None)
    except psutil.AccessDenied:
        pss = None
    return int(pss) if pss is not None else p.memory_info().rss


# The share of a core that reading a trial tree's PSS may take. The kernel walks each
# process's page tables for it: 20 to 50 ms a GiB resident (2-core VM), and a forked
# worker maps its parent's whole data set, so 8 ranks with 8 workers each over a 10 GiB
# data set are 720 GiB to walk. Meanwhile each process's memory-map lock is held (its
# allocator's mmap waits), and the trial being measured loses what the tuner takes.
PSS_SHARE = 0.05


# How often a trial's tree is looked at: once a second while its memory stays put, down to
# ten times a second while it grows towards its limit (a tensor loop touches gigabytes a
# second, so a second's lag would let it pass the limit by as much).
CHECK_S = 1.0
FAST_CHECK_S = 0.1


class TreeMemory:
    """What a tree holds, each page once (``tree_memory``), read only where it may have
    risen past the peak read so far (the summed resident sets, cheap, bound it from above)
    and no more often than ``PSS_SHARE`` of a core allows: the larger the tree, the longer
    between readings. With a ``limit``, it is read at once whenever it may have passed the
    limit, whatever that costs: the resident sets grew since the last reading by more than
    the room that reading left. (A forked worker writing to a page it shares grows the tree
    without growing a resident set; the readings the share allows catch that.)"""

    def __init__(self, pid: int, *, limit: int | None = None) -> None:
        self.pid, self.peak, self.limit = pid, 0, limit
        self.check_s = CHECK_S  # when to look again (``read``)
        self._due = 0.0
        self._reading = (0, 0)  # what was held and the resident sets' sum at the last reading
        self._resident = (time.monotonic(), 0)  # the resident sets' sum, and when it was taken

    def read(self) -> int | None:
        """What the tree holds now, in bytes (raising ``peak``); None where it cannot have
        risen past the peak or the limit, and a reading is not due."""
        start = time.monotonic()
        resident = tree_rss(self.pid)
        (then, before), (held, at) = self._resident, self._reading
        self._resident = (start, resident)
        # A page first touched adds as much to the resident sets as to what is held.
        bound = held + max(0, resident - at)
        over = self.limit is not None and bound > self.limit
        self.check_s = self._next_check_s(bound, (resident - before) / max(start - then, 1e-3))
        if not over and (start < self._due or resident <= self.peak):
            return None
        held = tree_memory(self.pid)
        self._due = start + (time.monotonic() - start) / PSS_SHARE
        self._reading = (held, resident)
        self.peak = max(self.peak, held)
        return held

    def _next_check_s(self, bound: int, growth: float) -> float:
        """Sooner than ``CHECK_S`` where the tree, growing as it did since the last look,
        would pass its limit before then."""
        if self.limit is None or growth <= 0:
            return CHECK_S
        return min(CHECK_S, max(FAST_CHECK_S, (self.limit - bound) / growth))


def kill_tree(pid: int) -> None:
    """SIGKILL a process, every descendant, and every process group among them."""
    for _ in range(3):  # children forked while we kill are caught on the next pass
        procs = []
        try:
            procs.append(psutil.Process(pid))
        except psutil.Error:
            pass
        procs.extend(descendants(pid))
        if not procs:
            return
        groups = set()
        for p in procs:
            try:
                groups.add(os.getpgid(p.pid))
            except OSError:
                pass
        groups.discard(os.getpgrp())  # never our own group
        for p in procs:
            try:
                p.kill()
            except psutil.Error:
                pass
        for g in groups:
            try:
                os.killpg(g, signal.SIGKILL)
            except OSError:
                pass
        psutil.wait_procs(procs, timeout=2)


def kill_marked(variable: str, value: str) -> None:
    """SIGKILL every process of ours whose environment, as it started, sets ``variable`` to
    ``value``: what a trial started and then left (a helper in a session of its own, whose
    parent exited before the tree was last walked) still carries the trial's marker."""
    marked = []
    for p in psutil.process_iter(["uids"]):
        try:
            if p.pid != os.getpid() and p.environ().get(variable) == value:
                marked.append(p)
        except psutil.Error:
            pass
    _kill_all(marked)


def reap_orphans(spare: Collection[int] = ()) -> None:
    """End any process left under us (we are their subreaper), but those in ``spare``:
    nothing outlives a run."""
    for child in psutil.Process().children(recursive=True):
        if child.pid in spare:
            continue
        try:
            child.kill()
        except psutil.Error:
            pass


def with_package_on_path(env: Mapping[str, str], package_root: str = PACKAGE_ROOT) -> dict[str, str]:
    """A copy of ``env`` whose PYTHONPATH starts with ``package_root``, so that a child
    started with it runs ``python -m autotune.…`` from this source tree; the PYTHONPATH
    already in ``env`` is kept after it."""
    return {**env, "PYTHONPATH": os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))}
