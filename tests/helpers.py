"""Helpers shared by the test modules (imported as `helpers`: two conftest.py files exist,
so `from conftest import` would be ambiguous)."""
from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import optuna
import psutil
import pytest

from autotune.config import TrialConfig
from autotune.document.run import CandidateDocument, RunDocument
from autotune.emit import outputs as emit
from autotune.errors import ContractError
from autotune.task import Task, load_task
from autotune.trials import launch

from recorded_run import load_doc

REPO = Path(__file__).resolve().parent.parent
MODELS = Path(__file__).resolve().parent / "models"


@functools.cache
def knob_cnn() -> Task:
    """tests/models/knob_cnn.py loaded once per test process: its contract check is a
    subprocess (torch imported), and the tests that tune it with a stand-in runner only
    need the Task it yields (a frozen dataclass). tests/test_task.py checks files afresh."""
    from autotune.task import load_task

    return load_task(MODELS / "knob_cnn.py")


@functools.cache
def pinned_allocator() -> str:
    """The allocator an end-to-end test pins where the allocator is not its subject: one
    autotune measures in warm processes, as by default (configurations that share their
    process knobs one after another in one process, `--fresh-trials` off), where it is
    installed (.ci/run installs tcmalloc); glibc's, whose configurations each start a
    fresh process, where it is not."""
    from autotune.probes.libraries import find_native_libraries

    return "tcmalloc" if find_native_libraries()[0]["tcmalloc"] else "default"


def written_document(out: Path) -> dict:
    """best_config.json as a run wrote it into ``out``."""
    return json.loads((out / "best_config.json").read_text())


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


def trial_measuring(trials: list[optuna.trial.FrozenTrial], out: Path) -> bool:
    """Whether one of ``trials`` is running and its trial process (under ``out/trials``)
    has started measuring it: the moment the kill-mid-trial tests wait for."""
    running = [t for t in trials if t.state == optuna.trial.TrialState.RUNNING and "config" in t.user_attrs]
    if not running:
        return False
    folder = out / "trials" / f"trial-{running[0].number:04d}"
    # A warm process was started for an earlier trial: its events in this folder say it
    # took this one.
    return bool(processes_of(str(folder) + os.sep) or processes_of(f"{folder}/spec.json")
                or (folder / "events.jsonl").exists())


def read_stale(journal: Path) -> list[int]:
    """The trials a resumed search found left running by a killed tuner (the study records
    them: Optuna cannot annotate another process's trial)."""
    storage = optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(journal)))
    attrs = optuna.load_study(study_name=None, storage=storage).user_attrs
    return sorted(int(k.split(":", 1)[1]) for k in attrs if k.startswith("stale_trial:"))


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


def run_as_group(argv: list[str], *, timeout: float, cwd: Path | None = None,
                 env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run ``argv`` in a session of its own until it ends (at most ``timeout`` s), then kill
    whatever of its process group is left: ranks or DataLoader workers it started never
    outlive the test. Its output goes to files, not pipes, so a child that ended while a
    process it started still holds its output returns at once (``subprocess.run`` would
    wait for that process too). Past ``timeout`` the test fails with the output so far."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=out, stderr=err,
                                stdin=subprocess.DEVNULL, text=True, start_new_session=True)
        timed_out = False
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:  # nothing of the group is left
                pass
            proc.wait()
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if timed_out:
        raise AssertionError(f"{' '.join(argv)[:200]} did not end within {timeout:g} s (its process "
                             f"group was killed):\n{stdout[-2000:]}\n{stderr[-4000:]}")
    return subprocess.CompletedProcess(argv, proc.returncode, stdout, stderr)


# --- the emitted launch.sh, run as a user runs it ----------------------------------------------


def run_document(cfg: TrialConfig, *, baseline: TrialConfig | None = None,
                 fingerprint: dict | None = None) -> RunDocument:
    """A whole run document for ``cfg`` to emit: the recorded run's, with ``cfg`` as the
    tuned configuration, ``baseline`` (default ``cfg``) as the user's, and ``fingerprint``
    (default: none, so the script warns about no machine difference)."""
    recorded = load_doc()
    base = baseline or cfg
    return dataclasses.replace(recorded, config=cfg, fingerprint=fingerprint or {},
                               baseline=dataclasses.replace(recorded.baseline, config=base))


def emit_outputs(out: Path, cfg: TrialConfig, model_file: Path = MODELS / "dropout_cnn.py", *,
                 baseline_batch: int | None = None,
                 python: str = sys.executable) -> RunDocument | CandidateDocument:
    """The files autotune emits for ``cfg`` (train_tuned.py, launch.sh, best_config.json),
    written into ``out`` for this machine: a run's result whose user trained at
    ``baseline_batch``, else a configuration's files alone; with ``python``, launch.sh runs
    that interpreter."""
    env, _ = launch.environment(cfg, machine=machine_doc())
    doc: RunDocument | CandidateDocument
    if baseline_batch:
        doc = emit.write_outputs(out, cfg=cfg, model_file=model_file, env=env, description="Train dropout_cnn",
                                 document=run_document(cfg, baseline=cfg.replace(batch_size=baseline_batch)))
    else:
        doc = emit.write_candidate(out, cfg=cfg, model_file=model_file, env=env, description="Train dropout_cnn")
    if python != sys.executable:
        (out / "launch.sh").write_text(emit.render_launcher(cfg=cfg, env=env, python=python))
    return doc


def run_launch_sh(out_dir: Path, cwd: Path, env: dict[str, str], *args: str,
                  timeout: float = 150) -> subprocess.CompletedProcess:
    """``bash out_dir/launch.sh *args`` from ``cwd`` (outside the repository, so that only
    what the script itself finds is used); it must succeed."""
    cwd.mkdir(parents=True, exist_ok=True)
    assert REPO not in cwd.resolve().parents
    proc = subprocess.run(["bash", str(out_dir / "launch.sh"), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def start_launch_sh(out: Path, cwd: Path, env: dict[str, str], *args: str) -> subprocess.Popen:
    """``bash out/launch.sh *args`` started from ``cwd``, its output piped (``interrupt_after``)."""
    cwd.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(["bash", str(out / "launch.sh"), *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def interrupt_after(proc: subprocess.Popen, line_start: str, signum: int) -> tuple[str, str]:
    """Send ``signum`` once the script printed a line starting with ``line_start``."""
    assert proc.stdout is not None
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if line.startswith(line_start):
            proc.send_signal(signum)
            break
    out, err = proc.communicate(timeout=120)
    return "".join(seen) + out, err


def left_running(script: Path) -> list[str]:
    """Processes still running the script (the check's, its DataLoader workers)."""
    out = []
    for p in psutil.process_iter(["cmdline"]):
        with_script = any(str(script) in part for part in (p.info["cmdline"] or []))
        if with_script and p.pid != os.getpid():
            out.append(" ".join(p.info["cmdline"]))
    return out


def contract_error(script: Path, args: tuple[str, ...] = (), timeout_s: float = 120) -> str:
    with pytest.raises(ContractError) as err:
        load_task(script, script_args=args, timeout_s=timeout_s)
    assert left_running(script) == []
    return str(err.value)


def emitted_report(task: Task, cfg: TrialConfig, machine, folder: Path, *, steps: int = 6) -> dict:
    """``cfg``'s launch.sh and run_tuned.py as a run emits them for ``task`` (a script), in
    ``folder``, and the report of a timed run of that launch.sh: what it ran with, read from
    inside it."""
    env, _ = launch.environment(cfg, machine=machine)
    emit.write_candidate(folder, cfg=cfg, model_file=task.path, env=env, description="t", script=task.script)
    report = folder / "report.json"
    subprocess.run(["bash", "launch.sh", "--max-steps", str(steps), "--report", str(report)], cwd=folder,
                   check=True, capture_output=True, timeout=300)
    return json.loads(report.read_text())


def two_rank_trial(task: Task, machine, folder: Path):
    """A trial of ``task`` (a script) as 2 ranks of one thread each at a global batch of 32: its
    runner (to run it again), the configuration and the trial's result."""
    from autotune.trials.protocol import Measurement
    from autotune.trials.runner import TrialRunner

    assert task.script is not None
    two = task.script.baseline(TrialConfig()).replace(nprocs=2, threads=1, batch_size=32)
    runner = TrialRunner(model_file=task.path, machine=machine, workdir=folder, script=task.script,
                         measurement=Measurement(window_s=0.2, windows=2))
    return runner, two, runner.run(two, name="two-ranks")


def one_screen(stdout: str, out: Path) -> list[str]:
    """The answer a run ends with, as it printed it (the last lines of ``stdout``), checked as
    a user reads it: at most 20 lines of at most 100 columns, whose first 6 hold the verdict
    with its figure, what to change, the command to train with and where the report is."""
    lines = stdout.rstrip("\n").splitlines()
    start = max(i for i, line in enumerate(lines) if line.startswith(("verified: ", "not verified: ")))
    lines = lines[start:]
    assert len(lines) <= 20, "\n".join(lines)
    # a path is as long as the user's --out makes it: measured as autotune's default one
    wide = [line for line in lines if len(line.replace(str(out), "autotune-out/model")) > 100]
    assert not wide, wide
    first = lines[:6]
    assert re.search(r"\d\.\d\dx", first[0]) or first[0].startswith("not verified: "), first
    assert first[1].startswith("change: "), first
    assert any(line.startswith("train with: ") and line.endswith("launch.sh") for line in first), first
    assert any(line.startswith("report: ") and str(out.name) in line for line in first), first
    return lines


ANSI = re.compile(r"\x1b(\[[0-9;?]*[ -/]*[@-~]|[()][0-9A-B]|[=>])")


def run_on_a_terminal(argv: list[str], *, timeout: float, columns: int = 100, **popen) -> SimpleNamespace:
    """``argv`` with its stderr on a pseudo-terminal of ``columns`` columns, as a user's shell
    gives it, and its stdout piped (the answer, read whole): its exit code, its stdout, what the
    terminal showed (control sequences taken out) and when, as (seconds since it started, the
    text shown so far)."""
    import fcntl
    import pty
    import struct
    import termios
    import threading
    import time

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
    env = {**popen.pop("env", os.environ), "TERM": "xterm-256color", "COLUMNS": str(columns)}
    began = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=slave, stdin=subprocess.DEVNULL, env=env, **popen)
    os.close(slave)
    raw: list[bytes] = []
    seen: list[tuple[float, str]] = []

    def read() -> None:
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:  # every end of the terminal closed
                return
            if not data:
                return
            raw.append(data)
            seen.append((time.monotonic() - began, ANSI.sub("", b"".join(raw).decode(errors="replace"))))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        stdout, _ = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        reader.join(timeout=10)
        os.close(master)
    screen = seen[-1][1] if seen else ""
    return SimpleNamespace(returncode=proc.returncode, stdout=stdout.decode(errors="replace"), stderr=screen,
                           seen=seen, ended_s=time.monotonic() - began)
