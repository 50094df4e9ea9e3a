"""Fault injection (issue 6): model files that hang, abort, exhaust memory,
raise, produce NaN, do not parse or lack a function. Each trial must end with the right
classification, the user's own log lines, and no process of its tree left behind.

The trials run through ``TrialRunner`` (real subprocesses, real rank groups), with short
measurements and small limits; the model files are in tests/models/faulty/.
"""
from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import psutil
import pytest

from autotune.config import TrialConfig
from autotune.trials.runner import Measurement, TrialRunner

from helpers import kernel_oom_kills, processes_of, survivors

FAULTY = Path(__file__).resolve().parent / "models" / "faulty"
REPO = Path(__file__).resolve().parent.parent
MEASURE = Measurement(warmup_steps=2, window_s=0.2, windows=2)
ONE = TrialConfig(threads=1, batch_size=8)  # one process, one thread


# --- processes -------------------------------------------------------------------------


class TreeWatcher:
    """Samples the processes of a marker while a trial runs: the test can then tell
    that the tree it expects (the ranks' launcher and its ranks, DataLoader workers) existed."""

    def __init__(self, marker: str) -> None:
        self.marker, self.seen = marker, {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.wait(0.2):
            for p in processes_of(self.marker):
                try:
                    self.seen.setdefault(p.pid, " ".join(p.cmdline()))
                except psutil.Error:
                    pass

    def __enter__(self) -> TreeWatcher:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


@pytest.fixture
def run_trial(tmp_path):
    """run_trial(model, cfg, **limits) -> (TrialResult, {pid: cmdline} seen while it ran).
    Asserts that no process of the trial outlives it, once its runner is closed (a trial
    that finishes well leaves its process warm for the next configuration until then)."""

    def run(model: str, cfg: TrialConfig, *, timeout_s: float = 90, hang_s: float = 30,
            setup_hang_s: float | None = None, memory_limit_bytes: int | None = None):
        runner = TrialRunner(model_file=FAULTY / model, machine={}, workdir=tmp_path,
                             measurement=MEASURE, timeout_s=timeout_s, hang_s=hang_s,
                             setup_hang_s=setup_hang_s, memory_limit_bytes=memory_limit_bytes)
        with TreeWatcher(str(tmp_path)) as watcher:
            try:
                result = runner.run(cfg, name="trial")
            finally:
                runner.shutdown()
        left = survivors(str(tmp_path))
        assert not left, f"processes of the trial survived it: {left}"
        return result, watcher.seen

    return run


def describe(result) -> str:
    return f"{result.status} {result.failure}: {result.message}\n--- log tail ---\n{result.log_tail}"




# --- hangs and timeouts ----------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("nprocs", [1, 2])
def test_hang_before_first_step_is_a_timeout(run_trial, nprocs):
    """build_dataset blocks forever: no step ever runs, so only the trial timeout can
    end it, and it must end the whole tree (the ranks' launcher and both ranks for nprocs=2)."""
    timeout_s = 8 if nprocs == 1 else 12  # past the start of the launcher and its ranks
    result, seen = run_trial("hang_build.py", TrialConfig(nprocs=nprocs, threads=1, batch_size=8),
                             timeout_s=timeout_s, hang_s=3)
    assert result.status == "failed" and result.failure == "timeout", describe(result)
    assert f"still running after {timeout_s} s" in result.message, describe(result)
    workers = [c for c in seen.values() if "autotune.trials.worker" in c]
    assert len(workers) >= nprocs + (1 if nprocs > 1 else 0), seen  # launcher + ranks


@pytest.mark.slow
@pytest.mark.parametrize(("model", "nprocs", "workers"), [
    ("hang_build.py", 1, 0), ("hang_build.py", 2, 0),
    ("hang_first_batch.py", 1, 0), ("hang_first_batch.py", 1, 2)])
def test_a_hang_in_setup_is_named_as_one_within_the_setup_limit(run_trial, model, nprocs, workers):
    """build_dataset, or the DataLoader's first batch, blocks: no heartbeat runs yet, so
    the setup limit (scaled from the contract check in a real run) is what ends it, long
    before the trial timeout, and the message names the phase."""
    cfg = TrialConfig(nprocs=nprocs, threads=1, batch_size=16, num_workers=workers)
    result, _ = run_trial(model, cfg, timeout_s=300, hang_s=3, setup_hang_s=5)
    assert result.status == "failed" and result.failure == "hang", describe(result)
    # the setup limit ended it (the trial timeout is 300 s), and the message names the phase
    assert "not set up after 5 s: stuck in setup" in result.message and "first batch" in result.message


def test_the_setup_limit_scales_with_the_contract_check():
    from autotune.harness import setup_hang_limit
    from autotune.task import Task

    quick = Task(path=Path("m.py"), batch_size=8, dataset_len=8, image_inputs=False,
                 has_evaluate=False, parameters=1, check_s=3.0)
    assert setup_hang_limit(quick) == 60.0, "a blocked first batch is reported within a minute"
    assert setup_hang_limit(dataclasses.replace(quick, check_s=40.0)) == 200.0


@pytest.mark.slow
@pytest.mark.parametrize(
    "model, cfg, expected_tree",
    [
        # __getitem__ blocks in each DataLoader worker after 64 items: the trial process
        # and its two loader workers.
        ("hang_getitem.py", TrialConfig(threads=1, batch_size=8, num_workers=2), 3),
        # rank 1 stops stepping, rank 0 waits in DDP's all-reduce: the launcher and two ranks.
        ("deadlock_rank.py", TrialConfig(nprocs=2, threads=1, batch_size=8), 3),
    ],
    ids=["dataloader-worker-blocks", "deadlocked-rank"],
)
def test_hang_after_steps_started_is_caught_by_the_heartbeat(run_trial, model, cfg, expected_tree):
    result, seen = run_trial(model, cfg, timeout_s=120, hang_s=3)
    # a hang, not the trial timeout: the heartbeat found it
    assert result.status == "failed" and result.failure == "hang", describe(result)
    assert re.search(r"no progress for \d+ s while steps ran", result.message), describe(result)
    assert result.setup, "the hang must come after setup, while steps run"
    assert len(seen) >= expected_tree, seen


@pytest.mark.slow
def test_a_step_slower_than_the_hang_timeout_is_slow_not_hung(run_trial):
    """Each step takes 1.5 s, over a 1 s --hang-timeout: the limit scales to five of the
    trial's own steps, so it measures (a stalled rank with fast steps is still caught
    within its --hang-timeout: test_hang_after_steps_started_is_caught_by_the_heartbeat)."""
    result, _ = run_trial("slow_step.py", ONE, timeout_s=120, hang_s=1)
    assert result.status == "ok", describe(result)
    # the premise (each step sleeps 1.5 s): the steps were slower than the --hang-timeout
    assert result.warmup.step_s > 1


# --- crashes and memory ----------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("nprocs", [1, 2])
def test_abort_is_a_crash_naming_the_signal(run_trial, nprocs):
    """os.abort() in forward: a signal, shown by name (for ranks, read from their launcher's log)."""
    result, _ = run_trial("abort.py", TrialConfig(nprocs=nprocs, threads=1, batch_size=8))
    assert result.status == "failed" and result.failure == "crash", describe(result)
    assert "SIGABRT" in result.message, describe(result)


@pytest.mark.slow
def test_a_flooding_print_is_cut_from_the_middle_of_the_log(tmp_path):
    """A print in __getitem__ writes megabytes a second: the log keeps its head and its
    tail within the cap, says what was cut, and the trial still measures."""
    cap = 256 * 1024
    runner = TrialRunner(model_file=FAULTY / "print_flood.py", machine={}, workdir=tmp_path,
                         measurement=Measurement(warmup_steps=2, window_s=1.0, windows=3),
                         timeout_s=90, log_cap_bytes=cap)
    result = runner.run(ONE, name="trial")
    assert result.status == "ok", describe(result)
    log = Path(result.log_path)
    assert log.stat().st_size <= cap
    text = log.read_text(errors="replace")
    assert "bytes of this log were cut here]" in text
    head, _, tail = text.partition("bytes of this log were cut here]")
    assert "item served: " in head[:10_000] and "item served: " in tail[-10_000:]
    assert any("bytes from the middle were cut" in w for w in result.warnings)


@pytest.mark.slow
def test_a_relative_data_path_means_in_trials_what_it_meant_in_the_check(tmp_path, monkeypatch):
    """A model file that opens data/items.txt relative to where autotune runs: it passed
    the contract check there, so its trials run there too."""
    from autotune.task import load_task

    project = tmp_path / "project"
    (project / "data").mkdir(parents=True)
    (project / "data" / "items.txt").write_text("\n".join(str(i % 7) for i in range(256)))
    (project / "model.py").write_text(
        "import torch\n"
        "batch_size = 16\n"
        "def build_dataset():\n"
        "    with open('data/items.txt') as f:\n"
        "        v = torch.tensor([float(line) for line in f])\n"
        "    return torch.utils.data.TensorDataset(v.unsqueeze(1), (v > 3).long())\n"
        "def build_model():\n"
        "    return torch.nn.Linear(1, 2)\n")
    monkeypatch.chdir(project)
    task = load_task(project / "model.py")  # the contract check, run here
    runner = TrialRunner(model_file=task.path, machine={}, workdir=tmp_path / "out" / "trials",
                         measurement=MEASURE, timeout_s=90)
    result = runner.run(ONE, name="trial")
    assert result.status == "ok", describe(result)


@pytest.mark.slow
def test_abort_log_shows_where_the_trial_died(run_trial):
    result, _ = run_trial("abort.py", ONE)
    assert result.failure == "crash", describe(result)
    assert "abort.py" in result.log_tail, describe(result)


@pytest.mark.slow
def test_memory_exhaustion_is_stopped_by_the_tuner_not_the_kernel(run_trial):
    """forward allocates without bound: the trial is stopped at its memory limit and
    classified out_of_memory; the kernel's OOM killer never fires (its log has no new
    line, and a sentinel process offered to it as the first victim survives)."""
    limit = int(1.5 * 2**30)
    before = kernel_oom_kills()
    sentinel = subprocess.Popen(["sleep", "600"])
    try:
        try:  # if the kernel had to choose, it would choose the sentinel first
            Path(f"/proc/{sentinel.pid}/oom_score_adj").write_text("1000")
        except OSError:
            pass
        result, _ = run_trial("oom.py", ONE, memory_limit_bytes=limit, timeout_s=120)
        assert result.status == "failed" and result.failure == "out_of_memory", describe(result)
        assert "MiB" in result.message, result.message
        # Stopped near the limit (polled a few times a second), far from the machine's size.
        assert result.peak_tree_mb * 2**20 < limit + 2 * 2**30, result.peak_tree_mb
        assert sentinel.poll() is None, "the sentinel process was killed"
        assert kernel_oom_kills() == before, "the kernel OOM killer fired"
    finally:
        sentinel.kill()
        sentinel.wait()


def _raised_under_forward(exc: BaseException) -> BaseException:
    """``exc`` as torch raises it inside a model file's forward: the traceback holds a
    frame of the model file, as every error from the user's step does."""
    model = FAULTY / "raise_forward.py"
    namespace: dict = {}
    exec(compile("def forward(exc):\n    raise exc\n", str(model), "exec"), namespace)
    try:
        namespace["forward"](exc)
    except BaseException as raised:
        return raised
    raise AssertionError("forward did not raise")


@pytest.mark.parametrize("make", [
    lambda torch: RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"),
    lambda torch: RuntimeError("cuDNN error: CUDNN_STATUS_ALLOC_FAILED"),
    lambda torch: RuntimeError("cuDNN error: CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED"),
    lambda torch: RuntimeError("CUDA error: out of memory\nCUDA kernel errors might be asynchronously "
                               "reported at some other API call, so the stacktrace below might be incorrect."),
    lambda torch: RuntimeError("CUDA driver error: CUDA_ERROR_OUT_OF_MEMORY"),
    lambda torch: torch.cuda.OutOfMemoryError("Tried to allocate 20.00 GiB. GPU 0 has a total capacity "
                                              "of 79.19 GiB of which 3.19 GiB is free."),
], ids=["cublas-handle", "cudnn", "cudnn9-device", "cuda-async", "driver", "torch-type"])
def test_an_allocation_failure_is_out_of_memory_whatever_its_words(make):
    """The GPU had no memory for cuBLAS's handle, cuDNN's workspace or a tensor: each is a
    configuration that held too much, not an error in the model file (whose forward it
    was raised under), so the memory knobs are tried and the batch range stops there."""
    import torch

    from autotune.trials.failure import classify
    from autotune.trials.protocol import Failure

    exc = _raised_under_forward(make(torch))
    assert classify(exc, str(FAULTY / "raise_forward.py")) == Failure.OUT_OF_MEMORY


@pytest.mark.parametrize("message", [
    # a full GPU can cause it, but so can a cuBLAS that does not load: no memory knob fixes that
    "CUDA error: CUBLAS_STATUS_NOT_INITIALIZED when calling `cublasCreate(handle)`",
    "CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasSgemm( handle, opa, opb, m, n, k)`",
])
def test_a_cuda_library_error_that_is_not_an_allocation_stays_the_model_files(message):
    from autotune.trials.failure import classify
    from autotune.trials.protocol import Failure

    exc = _raised_under_forward(RuntimeError(message))
    assert classify(exc, str(FAULTY / "raise_forward.py")) == Failure.USER_ERROR


@pytest.mark.slow
def test_the_batch_range_stops_as_memory_bound_at_an_allocation_failure(tmp_path):
    """A real trial whose forward fails as cuBLAS does on a full GPU at batch 64: the batch
    ramp stops there as bound by memory, so the search offers no larger batch (after a
    failure of another kind it would keep the default range, eight times the user's batch)."""
    from autotune.search import batch_range

    runner = TrialRunner(model_file=FAULTY / "alloc_fails_at_big_batch.py", machine={}, workdir=tmp_path,
                         measurement=MEASURE, timeout_s=90)
    try:
        found = batch_range.ramp(runner, TrialConfig(threads=1, batch_size=32), most=512, limit=None)
    finally:
        runner.shutdown()
    assert found.stopped == "batch 64 ran out of memory", found
    assert found.memory_bound and found.top == 32, found


HELD_BYTES = 512 * 2**20  # tests/models/faulty/holds_a_data_set.py's


@pytest.mark.slow
def test_forked_dataloader_workers_count_their_parents_data_set_once(tmp_path):
    """A process holds a data set in memory and four DataLoader workers fork from it: each
    has the data set resident, but the machine holds it once, and so must the count that
    the trial memory limit and the verification budget compare (a data set counted once
    per worker, 72 times on 8 ranks of 8 workers, stops trials that fit)."""
    from autotune.trials import proctree

    script = tmp_path / "holds.py"
    script.write_text(
        "import sys, time, torch\n"
        f"sys.path.insert(0, {str(FAULTY)!r})\n"
        "from holds_a_data_set import build_dataset\n"
        "loader = iter(torch.utils.data.DataLoader(build_dataset(), batch_size=8, num_workers=4))\n"
        "next(loader)\n"  # the workers are started, each with the data set resident
        "print('ready', flush=True)\n"
        "time.sleep(120)\n")
    proc = subprocess.Popen([sys.executable, "-W", "ignore", str(script)], stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        assert len(proctree.descendants(proc.pid)) >= 4
        # the premise: summed resident sets count the data set once per process
        assert proctree.tree_rss(proc.pid) > 4 * HELD_BYTES
        counted = proctree.tree_memory(proc.pid)
        assert HELD_BYTES < counted < 2 * HELD_BYTES, counted / 2**20
    finally:
        proctree.kill_tree(proc.pid)
        proc.wait()


@pytest.mark.slow
def test_a_tree_growing_past_its_limit_is_read_at_once_however_costly_its_last_reading(monkeypatch):
    """Reading what a tree holds is rationed by its cost (a slow reading puts the next one
    seconds off), but not when the tree may have passed its limit: a process that touches
    gigabytes a second would be far past it by then. And while it grows towards the limit,
    it is looked at more often than once a second."""
    from autotune.trials import proctree

    measured = proctree.tree_memory

    def slow(pid: int) -> int:  # the kernel's walk of a large tree: the next reading is 10 s off
        time.sleep(0.5)
        return measured(pid)

    monkeypatch.setattr(proctree, "tree_memory", slow)
    proc = subprocess.Popen(
        [sys.executable, "-c",
         "import sys\nsys.stdin.readline()\nheld = b'x' * (512 * 2**20)\n"
         "print('held', flush=True)\nsys.stdin.readline()\n"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        watch = proctree.TreeMemory(proc.pid, limit=384 * 2**20)
        first = watch.read()
        assert first is not None and first < 128 * 2**20, first
        proc.stdin.write(b"go\n")
        proc.stdin.flush()
        assert proc.stdout.readline() == b"held\n"
        held = watch.read()
        assert held is not None and held > 384 * 2**20, held
        assert watch.check_s < proctree.CHECK_S, watch.check_s
    finally:
        proctree.kill_tree(proc.pid)
        proc.wait()


@pytest.mark.slow
def test_a_trial_whose_workers_share_its_data_set_is_not_stopped_as_out_of_memory(tmp_path):
    """The trial holds 512 MiB once and four workers share it, under a 1.5 GiB limit: it
    measures. Its processes' resident sets summed pass the limit while it runs (that count
    stopped it as out of memory)."""
    limit = 3 * HELD_BYTES
    runner = TrialRunner(model_file=FAULTY / "holds_a_data_set.py", machine={}, workdir=tmp_path,
                         measurement=Measurement(warmup_steps=2, window_s=1.0, windows=3),
                         timeout_s=120, memory_limit_bytes=limit)
    summed, stop = [0], threading.Event()

    def sample() -> None:
        while not stop.wait(0.2):
            total = 0
            for p in processes_of(str(tmp_path)):
                try:
                    total += p.memory_info().rss
                except psutil.Error:
                    pass
            summed[0] = max(summed[0], total)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        result = runner.run(TrialConfig(threads=1, batch_size=8, num_workers=4), name="trial")
    finally:
        stop.set()
        sampler.join()
        runner.shutdown()
    assert result.status == "ok", describe(result)
    assert summed[0] > limit, summed[0] / 2**20  # the premise: summed resident sets pass it
    assert HELD_BYTES / 2**20 < result.peak_tree_mb < limit / 2**20, result.peak_tree_mb


# --- errors in the user's code ---------------------------------------------------------


@pytest.mark.slow
def test_raise_in_forward_is_a_user_error_shown_with_its_log(run_trial):
    result, _ = run_trial("raise_forward.py", ONE)
    assert result.status == "failed" and result.failure == "user_error", describe(result)
    assert "deliberate failure in forward" in result.message, describe(result)
    # The user sees the last lines of the trial's own log: their exception, their file.
    assert "deliberate failure in forward" in result.log_tail
    assert "raise_forward.py" in result.log_tail


@pytest.mark.slow
def test_nan_loss_is_classified(run_trial):
    result, _ = run_trial("nan_loss.py", ONE)
    assert result.status == "failed" and result.failure == "nan_loss", describe(result)
    assert "nan" in result.message.lower(), describe(result)


@pytest.mark.parametrize(
    "model, words",
    [("syntax_error.py", ["SyntaxError", "syntax_error.py"]),
     ("missing_dataset.py", ["build_dataset"])],
    ids=["syntax-error", "missing-function"],
)
@pytest.mark.slow
def test_broken_model_file_is_a_user_error(run_trial, model, words):
    """The contract check refuses these before any trial (see the CLI test below); a
    trial that meets one anyway must still blame the model file, not the tuner."""
    result, _ = run_trial(model, ONE)
    assert result.status == "failed" and result.failure == "user_error", describe(result)
    for word in words:
        assert word in result.message, describe(result)


@pytest.mark.slow
def test_raise_in_dataloader_worker_is_a_user_error(run_trial):
    result, seen = run_trial("worker_fails.py", TrialConfig(threads=1, batch_size=8, num_workers=1))
    assert result.status == "failed" and result.failure == "user_error", describe(result)
    assert "deliberate failure in a DataLoader worker" in result.message, describe(result)
    assert "worker_fails.py" in result.log_tail


@pytest.mark.slow
def test_helper_process_in_its_own_session_ends_with_the_trial(run_trial, monkeypatch):
    """A process the model file starts in a session of its own (like the ranks of a job)
    is still part of the trial's tree and ends with it."""
    token = f"tok-{uuid.uuid4().hex}"
    monkeypatch.setenv("AUTOTUNE_FAULT_TOKEN", token)
    try:
        result, _ = run_trial("spawns_helper.py", TrialConfig(threads=1, batch_size=16))
        assert result.status == "ok", describe(result)
        assert not survivors(token), "the model's helper process outlived the trial"
    finally:
        survivors(token)


@pytest.mark.slow
def test_contract_check_leaves_no_process_behind(monkeypatch):
    from autotune.task import load_task

    token = f"tok-{uuid.uuid4().hex}"
    monkeypatch.setenv("AUTOTUNE_FAULT_TOKEN", token)
    try:
        task = load_task(FAULTY / "spawns_helper.py")
        assert task.batch_size == 16
        assert not survivors(token, grace_s=2.0), "the check's helper process outlived it"
    finally:
        survivors(token, grace_s=0)


# --- the command line refuses broken files before any trial -----------------------------


@pytest.mark.parametrize(
    "model, expected",
    [("syntax_error.py", r"syntax_error\.py:7: syntax error"),
     ("missing_dataset.py", r"missing_dataset\.py: no function build_dataset\(\)")],
    ids=["syntax-error", "missing-function"],
)
@pytest.mark.slow
def test_cli_refuses_a_broken_model_file_before_any_trial(tmp_path, model, expected):
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "autotune", "run", str(FAULTY / model), "--out", str(out)],
        capture_output=True, text=True, timeout=300, cwd=REPO,
    )
    assert proc.returncode == 2, proc.stderr
    assert re.search(expected, proc.stderr), proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    assert not (out / "trials").exists() and not (out / "study.journal").exists()
