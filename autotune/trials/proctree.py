"""Process trees: a trial is a tree (the ranks' launcher, ranks, DataLoader workers, compile
workers) whose members may sit in different process groups, so ending a trial means
walking the tree, not signalling one group."""
from __future__ import annotations

import ctypes
import os
import signal

import psutil

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


def tree_rss(pid: int) -> int:
    """Resident memory of a process and all its descendants, in bytes."""
    total = 0
    try:
        procs = [psutil.Process(pid), *descendants(pid)]
    except psutil.Error:
        return 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total


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


def reap_orphans() -> None:
    """End any process left under us (we are their subreaper): nothing outlives a run."""
    for child in psutil.Process().children(recursive=True):
        try:
            child.kill()
        except psutil.Error:
            pass
