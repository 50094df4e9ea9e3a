"""Helpers shared by the test modules (imported as `helpers`: two conftest.py files exist,
so `from conftest import` would be ambiguous)."""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import optuna
import psutil

REPO = Path(__file__).resolve().parent.parent
MODELS = Path(__file__).resolve().parent / "models"


def machine_doc() -> dict:
    """The parts of a probe document that trials and launch.sh read, for this machine."""
    cpus = sorted(os.sched_getaffinity(0))
    return {
        "cpu": {"usable_cpus": cpus, "usable_cores": len(cpus), "isa": {}},
        "backends": {"gloo": True},
        "allocators": {},
        "gpus": [],
    }


def processes_of(marker: str) -> list[psutil.Process]:
    """Live processes whose command line, working directory or trial folder (the
    variable every trial's processes inherit) mentions ``marker``."""
    from autotune.trials.runner import TRIAL_DIR_VARIABLE

    found = []
    for p in psutil.process_iter(["pid", "cmdline", "cwd", "status"], ad_value=None):
        info = p.info
        if info["pid"] == os.getpid() or info["status"] == psutil.STATUS_ZOMBIE:
            continue
        try:
            trial_dir = p.environ().get(TRIAL_DIR_VARIABLE, "")
        except psutil.Error:
            trial_dir = ""
        if marker in " ".join(info["cmdline"] or []) + " " + (info["cwd"] or "") + " " + trial_dir:
            found.append(p)
    return found


def survivors(marker: str, *, grace_s: float = 1.0) -> list[str]:
    """Processes of ``marker`` alive after ``grace_s``; killed here, never left behind."""
    procs = processes_of(marker)
    if procs and grace_s:
        _, procs = psutil.wait_procs(procs, timeout=grace_s)
    left = []
    for p in procs:
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                left.append(f"{p.pid} {' '.join(p.cmdline())[:200]}")
                p.kill()
        except psutil.Error:
            pass
    return left


def read_trials(journal: Path) -> list[optuna.trial.FrozenTrial]:
    """The study's trials, read from its journal (also while a tuner writes it)."""
    storage = optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(journal)))
    study = optuna.load_study(study_name=None, storage=storage)
    return study.get_trials(deepcopy=False)


def read_stale(journal: Path) -> list[int]:
    """The trials a resumed search found left running by a killed tuner (the study records
    them: Optuna cannot annotate another process's trial)."""
    storage = optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(journal)))
    return list(optuna.load_study(study_name=None, storage=storage).user_attrs.get("stale", []))


def kernel_oom_kills() -> int:
    """How many processes the kernel's OOM killer has killed since boot (/proc/vmstat's
    oom_kill, readable without privileges; Linux 4.13 and later). The kernel log's
    OOM lines count instead where the counter is missing; neither readable fails the
    test that asks, rather than letting its check pass unseen."""
    try:
        with open("/proc/vmstat") as f:
            for line in f:
                if line.startswith("oom_kill "):
                    return int(line.split()[1])
    except OSError:
        pass
    try:
        out = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        out = None
    if out is None or out.returncode != 0 or not out.stdout:
        raise AssertionError("cannot tell whether the kernel OOM killer fired: no oom_kill in "
                             "/proc/vmstat and the kernel log cannot be read")
    return sum(1 for line in out.stdout.splitlines()
               if re.search(r"oom-kill|Out of memory|Killed process|invoked oom-killer", line))
