"""The CUDA paths of the runtime, the worker and the trial runner, on a CPU build: torch's
CUDA functions are replaced where a path needs a GPU, and the backend flags, which a CPU
build sets and reads all the same, are inspected. Each test names the finding of the GPU
review it covers (C: crash, W: wrong number, S: slow, K: cosmetic)."""
from __future__ import annotations

import datetime
import json
import os
import signal
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest
import torch

from autotune.config import TrialConfig
from autotune.emit import outputs as emit
from autotune.runtime.distributed import Distributed
from autotune.runtime.loop import Checkpoints, Metrics, evaluate, train
from autotune.runtime.model import NonFiniteLoss, build_model, check_finite, make_step, sync_batchnorm
from autotune.runtime.session import Session, apply_process_knobs, configure_precision
from autotune.trials import worker
from autotune.trials.events import DoneEvent
from autotune.trials.protocol import Failure, Measurement, Mode, Status
from autotune.trials.runner import TrialResult, TrialRunner, run_launcher
from autotune.trials.script_report import ScriptReport

TINY_MODEL = '''
import time

import torch

EVALUATE_S = 0.0
EVALUATE_RAISES = False


def build_dataset():
    g = torch.Generator().manual_seed(0)
    return torch.utils.data.TensorDataset(torch.randn(32, 4, generator=g),
                                          torch.randint(0, 2, (32,), generator=g))


def build_model():
    return torch.nn.Linear(4, 2)


def evaluate(model):
    if EVALUATE_RAISES:
        raise RuntimeError("evaluate() was called")
    time.sleep(EVALUATE_S)
    return 0.5
'''


def tiny_model(folder: Path, **settings: object) -> Path:
    """A model file of 32 items (8 steps per epoch at batch 4) with the given settings."""
    text = TINY_MODEL
    for name, value in settings.items():
        text = text.replace(f"{name} = ", f"{name} = {value!r}  # was ", 1)
    path = folder / "tiny.py"
    path.write_text(text)
    return path


@pytest.fixture
def cuda_flags():
    """The process-wide backend flags as they were, restored after the test: through both
    APIs, so that neither raises "mix of the legacy and new APIs" for a later reader."""
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    saved = (matmul.fp32_precision, cudnn.conv.fp32_precision, cudnn.rnn.fp32_precision,
             matmul.allow_tf32, cudnn.allow_tf32, cudnn.benchmark)
    yield
    matmul.fp32_precision, cudnn.conv.fp32_precision, cudnn.rnn.fp32_precision = saved[:3]
    matmul.allow_tf32, cudnn.allow_tf32, cudnn.benchmark = saved[3:]
    torch.get_float32_matmul_precision()  # readable again


@pytest.fixture
def in_process(monkeypatch):
    """Running a Session in this process: train() installs signal handlers and the model
    file's folder goes onto sys.path; both are put back."""
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    monkeypatch.setattr(sys, "path", list(sys.path))
    for key in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "TUNED_STORE", "TUNED_NPROCS"):
        monkeypatch.delenv(key, raising=False)
    yield
    for s, handler in handlers.items():
        signal.signal(s, handler)


class Recorder:
    """Stands in for torch functions: records each call's arguments."""

    def __init__(self, result: object = None) -> None:
        self.calls: list[tuple[tuple, dict]] = []
        self.result = result

    def __call__(self, *args: object, **kwargs: object) -> object:
        self.calls.append((args, kwargs))
        return self.result


# --- W1: PyTorch's defaults for the baseline and fp32, IEEE fp32 for the reference ---------


def test_fp32_on_cuda_leaves_pytorchs_defaults(cuda_flags):
    """W1: no forced cudnn.benchmark, and cuDNN's TF32 stays on as PyTorch has it."""
    apply_process_knobs({"device": "cuda", "precision": "fp32"})
    assert torch.backends.cudnn.benchmark is False
    assert torch.backends.cudnn.allow_tf32 is True
    assert torch.backends.cuda.matmul.allow_tf32 is False


def test_tf32_is_matmul_tf32_on_top_of_the_defaults_and_stays_readable(cuda_flags):
    """W1: "tf32" turns matmul TF32 on and leaves cuDNN alone; the flag reads the same
    through the new and the legacy API (inductor reads the legacy one)."""
    apply_process_knobs({"device": "cuda", "precision": "tf32"})
    assert torch.backends.cuda.matmul.fp32_precision == "tf32"
    assert torch.backends.cuda.matmul.allow_tf32 is True
    assert torch.get_float32_matmul_precision() == "high"
    assert torch.backends.cudnn.allow_tf32 is True
    assert torch.backends.cudnn.benchmark is False


def test_cudnn_benchmark_is_a_knob_of_cuda_configurations(cuda_flags):
    apply_process_knobs({"device": "cpu", "cudnn_benchmark": True})
    assert torch.backends.cudnn.benchmark is False
    apply_process_knobs({"device": "cuda", "cudnn_benchmark": True})
    assert torch.backends.cudnn.benchmark is True


def test_each_configuration_of_a_warm_process_gets_its_own_float_flags(cuda_flags):
    """A warm process that trained a tf32 configuration, or an fp32 trajectory in strict
    IEEE fp32, gives the next configuration PyTorch's defaults again (W1's baseline)."""
    apply_process_knobs({"device": "cuda", "precision": "tf32"})
    configure_precision({"device": "cuda", "precision": "fp32"})
    assert torch.backends.cuda.matmul.allow_tf32 is False
    assert torch.backends.cudnn.allow_tf32 is True
    configure_precision({"device": "cuda", "precision": "fp32"}, strict_fp32=True)
    assert torch.backends.cudnn.allow_tf32 is False
    configure_precision({"device": "cuda", "precision": "bf16"})
    assert torch.backends.cudnn.allow_tf32 is True and torch.backends.cuda.matmul.allow_tf32 is False


def test_a_finished_configuration_returns_the_gpus_memory_and_resets_its_peak(monkeypatch):
    """What a warm process does between configurations on CUDA: the next one's reserved
    peak (K2) is its own, and its memory starts empty."""
    calls = {name: Recorder() for name in ("synchronize", "empty_cache", "reset_peak_memory_stats")}
    for name, recorder in calls.items():
        monkeypatch.setattr(torch.cuda, name, recorder)
    device = torch.device("cuda", 0)
    session = Session.__new__(Session)
    session.cfg = {"device": "cuda", "compile": "off"}
    session.batches = (x for x in ())
    session.loader = types.SimpleNamespace()
    session.dist = types.SimpleNamespace(device=device)  # type: ignore[assignment]
    session.release()
    assert calls["empty_cache"].calls and calls["reset_peak_memory_stats"].calls[0][0] == (device,)
    assert session.model is None and session.optimizer is None


def test_strict_fp32_forces_ieee_matmuls_and_convolutions(cuda_flags):
    """W1: the numerics reference (and an fp32 candidate beside it) in true fp32."""
    apply_process_knobs({"device": "cuda", "precision": "fp32"}, strict_fp32=True)
    assert torch.backends.cuda.matmul.allow_tf32 is False
    assert torch.backends.cudnn.allow_tf32 is False
    assert torch.backends.cuda.matmul.fp32_precision != "tf32"
    assert torch.backends.cudnn.conv.fp32_precision != "tf32"
    assert torch.get_float32_matmul_precision() == "highest"


@pytest.mark.parametrize(("mode", "precision", "strict"), [
    (Mode.TRAJECTORY, "fp32", True), (Mode.TRAJECTORY, "bf16", False), (Mode.MEASURE, "fp32", False),
])
def test_the_worker_asks_for_strict_fp32_in_fp32_trajectories_only(tmp_path, monkeypatch, mode, precision,
                                                                   strict):
    seen: dict = {}

    def setup(*args: object, **kwargs: object) -> None:
        seen.update(kwargs)
        raise RuntimeError("no session in this test")

    monkeypatch.setattr("autotune.runtime.session.ProcessSetup", setup)
    monkeypatch.setattr(worker.proctree, "die_with_parent", lambda: None)
    monkeypatch.setattr(worker.proctree, "reap_orphans", lambda: None)  # this process's children
    monkeypatch.setattr(os, "_exit", exit_raises)
    spec = write_spec(tmp_path, {"precision": precision, "batch_size": 4}, mode=mode, steps=3)
    with pytest.raises(Exited):
        worker.main([str(spec)])
    assert seen["strict_fp32"] is strict


# --- W3: the worker's error path leaves as its success path does ----------------------------


class Exited(Exception):
    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def exit_raises(code: int) -> None:
    raise Exited(code)


def write_spec(folder: Path, config: dict, **fields: object) -> Path:
    spec = folder / "spec.json"
    spec.write_text(json.dumps({"model_file": str(folder / "missing.py"), "config": config,
                                "events": str(folder / "events.jsonl"), **fields}))
    return spec


def test_a_worker_that_reported_an_error_leaves_without_interpreter_teardown(tmp_path, monkeypatch):
    """W3: after the ERROR event, flush and os._exit(3): teardown of a live NCCL group can
    stall, and a rank that never exits turns its error into a hang."""
    monkeypatch.setattr(worker.proctree, "die_with_parent", lambda: None)
    monkeypatch.setattr(worker.proctree, "reap_orphans", lambda: None)  # this process's children
    monkeypatch.setattr(os, "_exit", exit_raises)
    monkeypatch.delenv("RANK", raising=False)
    spec = write_spec(tmp_path, {"batch_size": 4})
    with pytest.raises(Exited) as exited:
        worker.main([str(spec)])
    assert exited.value.code == 3
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert [e["e"] for e in events] == ["error"]


FAKE_WORKER = '''
import json, sys, time
spec = json.load(open(sys.argv[-1]))
with open(spec["events"], "a") as f:
    for line in ({"e": "setup", "seconds": 0.1, "t": time.time()}, {"e": "beat", "step": 1, "t": time.time()},
                 {"e": "error", "kind": "out_of_memory", "message": "CUDA out of memory", "rank": 1}):
        f.write(json.dumps(line) + "\\n")
time.sleep(600)  # the peers wait in a collective for the rank that failed
'''


@pytest.mark.parametrize("limit", ["hang", "timeout"])
def test_a_reported_error_is_the_failure_not_the_hang_or_timeout_kill_after_it(tmp_path, limit):
    """W3: a rank reported CUDA OOM and the others hung in a collective until the tuner
    killed them: the trial failed of out_of_memory."""
    fake = tmp_path / "fake_worker.py"
    fake.write_text(FAKE_WORKER)
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\nexec {sys.executable} {fake} \"$@\"\n")
    python.chmod(0o755)
    runner = TrialRunner(model_file=tmp_path / "model.py", machine={}, workdir=tmp_path / "trials",
                         measurement=Measurement(warmup_steps=2, window_s=0.2, windows=1),
                         timeout_s=2.0 if limit == "timeout" else 60.0,
                         hang_s=1.0 if limit == "hang" else 60.0, python=str(python))
    result = runner.run(TrialConfig(threads=1, batch_size=8), name="trial")
    assert result.status == Status.FAILED
    assert result.failure == Failure.OUT_OF_MEMORY, result.message
    assert result.message == "CUDA out of memory"


# --- K2: the GPU's memory in the trial's summary ------------------------------------------


def test_the_worker_reports_rank_0s_reserved_peak_and_the_gpus_size(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", Recorder(3 * 2**20))
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        Recorder(types.SimpleNamespace(total_memory=80 * 2**30)))
    session = types.SimpleNamespace(dist=types.SimpleNamespace(device=torch.device("cuda", 0),
                                                               agree_max=lambda value: value))
    done = worker.finish(session, [10.0, 12.0], [1.0])  # type: ignore[arg-type]
    assert done.cuda_peak_mb == 3.0 and done.cuda_total_mb == 80 * 1024
    assert done.rank_peak_mb == 3.0  # what --memory-limit bounds on a GPU
    assert torch.cuda.max_memory_reserved.calls[0][0] == (torch.device("cuda", 0),)


def test_the_trial_summary_keeps_the_gpu_memory_on_cuda_only():
    cuda = TrialResult(status=Status.OK, done=DoneEvent(cuda_peak_mb=1500.0, cuda_total_mb=81559.0))
    assert cuda.summary()["cuda_peak_mb"] == 1500.0 and cuda.summary()["cuda_total_mb"] == 81559.0
    cpu = TrialResult(status=Status.OK, done=DoneEvent(cuda_peak_mb=None, cuda_total_mb=None))
    assert "cuda_peak_mb" not in cpu.summary() and "cuda_total_mb" not in cpu.summary()


# --- C2, K8: losses kept across steps ------------------------------------------------------


class StaticLoss(torch.autograd.Function):
    """The loss written into one tensor held by the model, as a CUDA graph writes its
    output into the same memory at every replay."""

    @staticmethod
    def forward(ctx, loss: torch.Tensor, out: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        out.copy_(loss)
        ctx.mark_dirty(out)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        return grad, None


def static_output_step():
    model = torch.nn.Linear(4, 2)
    model.register_buffer("out", torch.zeros(()))

    def training_step(model: torch.nn.Module, batch: tuple) -> torch.Tensor:
        x, y = batch
        return StaticLoss.apply(torch.nn.functional.cross_entropy(model(x), y), model.out.detach())

    user = types.SimpleNamespace(training_step=training_step)
    return user, model, torch.optim.SGD(model.parameters(), lr=0.5)


def test_a_kept_loss_survives_the_next_step_that_reuses_its_memory():
    """C2: under reduce-overhead the loss may be a CUDA graph's output, overwritten by the
    next replay; the step returns a loss of its own."""
    user, model, optimizer = static_output_step()
    step = make_step(user, model, optimizer, {}, torch.device("cpu"))
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(8, 4, generator=g), torch.randint(0, 2, (8,), generator=g)) for _ in range(2)]
    first = step(batches[0])
    value = float(first)
    second = step(batches[1])
    assert float(second) != value
    assert float(first) == value
    assert check_finite([first, second]) == [value, float(second)]


def test_reduce_overhead_marks_each_step_as_a_new_cuda_graph_iteration(monkeypatch):
    marks = Recorder()
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", marks)
    user, model, optimizer = static_output_step()
    batch = (torch.randn(8, 4), torch.randint(0, 2, (8,)))
    make_step(user, model, optimizer, {}, torch.device("cpu"))(batch)
    assert not marks.calls
    step = make_step(user, model, optimizer, {"compile": "reduce-overhead"}, torch.device("cpu"))
    step(batch)
    step(batch)
    assert len(marks.calls) == 2


def test_check_finite_reads_all_losses_in_one_transfer(monkeypatch):
    """K8: one synchronisation for a window's losses, not one per loss."""
    losses = [torch.tensor(float(i)) for i in range(5)]
    floats = Recorder()
    original = torch.Tensor.__float__

    def counted(self: torch.Tensor) -> float:
        floats(self)
        return original(self)

    monkeypatch.setattr(torch.Tensor, "__float__", counted)
    assert check_finite(losses) == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert not floats.calls
    assert check_finite([]) == []
    with pytest.raises(NonFiniteLoss, match="at step 2"):
        check_finite([torch.tensor(1.0), torch.tensor(2.0), torch.tensor(float("nan"))])


# --- C5, S2: devices of the ranks, SyncBatchNorm --------------------------------------------


def fake_cuda(monkeypatch, *, count: int) -> Recorder:
    set_device = Recorder()
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.cuda, "set_device", set_device)
    return set_device


def test_a_rank_whose_task_sees_one_gpu_uses_cuda_0(monkeypatch):
    """C5: under Slurm's per-task GPU binding local rank 3 sees one GPU, as cuda:0."""
    set_device = fake_cuda(monkeypatch, count=1)
    monkeypatch.delenv("TUNED_STORE", raising=False)
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "3")
    dist = Distributed({"device": "cuda"})
    assert dist.device == torch.device("cuda", 0)
    assert [torch.device("cuda", a) if isinstance(a, int) else a
            for (a,), _ in set_device.calls] == [torch.device("cuda", 0)]


def test_more_ranks_than_visible_gpus_is_refused_naming_both_and_the_fix(monkeypatch, tmp_path):
    """C5: ranks started by start_ranks, 4 of them for 2 GPUs: a clear error before NCCL's
    "duplicate GPU"."""
    fake_cuda(monkeypatch, count=2)
    monkeypatch.setattr(torch.distributed, "init_process_group",
                        lambda *a, **k: pytest.fail("init_process_group reached"))
    monkeypatch.setenv("TUNED_STORE", str(tmp_path / "store"))
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "0")
    with pytest.raises(RuntimeError, match=r"4 ranks.* 2 GPU\(s\).*TUNED_NPROCS=2.*CUDA_VISIBLE_DEVICES"):
        Distributed({"device": "cuda", "backend": "nccl"})


class OnFakeDevice(torch.nn.Sequential):
    """A model whose move to a device is a no-op: a CPU build has no CUDA to move to."""

    def to(self, *args: object, **kwargs: object) -> OnFakeDevice:  # type: ignore[override]
        return self


class FakeDDP(torch.nn.Module):
    def __init__(self, module: torch.nn.Module, device_ids: list[int] | None = None) -> None:
        super().__init__()
        self.module, self.device_ids = module, device_ids


def test_several_cuda_ranks_get_syncbatchnorm_and_ddp_on_their_own_device(monkeypatch):
    """S2: BatchNorm's statistics over the global batch on several GPUs; C5: DDP's device
    is the rank's device, not its local rank."""
    monkeypatch.setattr(torch.nn.parallel, "DistributedDataParallel", FakeDDP)
    user = types.SimpleNamespace(build_model=lambda: OnFakeDevice(torch.nn.Conv2d(3, 4, 3),
                                                                  torch.nn.BatchNorm2d(4)))
    dist = types.SimpleNamespace(device=torch.device("cuda", 0), local_rank=5, world=2, enabled=True,
                                 nodes=1)
    model, optimizer, _ = build_model(user, {}, dist, None)  # type: ignore[arg-type]
    assert isinstance(model, FakeDDP) and model.device_ids == [0]
    assert isinstance(model.module[1], torch.nn.SyncBatchNorm)
    assert {id(p) for p in model.parameters()} == {id(p) for g in optimizer.param_groups for p in g["params"]}


def test_batchnorm_is_kept_on_cpu_and_in_one_process():
    for device, world in ((torch.device("cpu"), 2), (torch.device("cuda", 0), 1)):
        model = sync_batchnorm(torch.nn.Sequential(torch.nn.BatchNorm2d(4)), device, world)
        assert type(model[0]) is torch.nn.BatchNorm2d


# --- C7, S5: timeouts, agreement on the host ------------------------------------------------


def test_several_cuda_ranks_get_a_long_timeout_and_agree_on_the_host(monkeypatch, tmp_path):
    """C7: collectives wait up to an hour (NCCL's default is 10 minutes); S5: agree_max and
    barrier go through a gloo group on CPU tensors, never draining the GPU's queue."""
    fake_cuda(monkeypatch, count=2)
    init, new_group = Recorder(), Recorder("host group")
    all_reduce, barrier = Recorder(), Recorder()
    for name, fake in (("init_process_group", init), ("new_group", new_group),
                       ("all_reduce", all_reduce), ("barrier", barrier)):
        monkeypatch.setattr(torch.distributed, name, fake)
    monkeypatch.setenv("TUNED_STORE", str(tmp_path / "store"))
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    dist = Distributed({"device": "cuda", "backend": "nccl"})
    assert init.calls[0][1]["timeout"] == datetime.timedelta(minutes=60)
    assert new_group.calls == [((), {"backend": "gloo", "timeout": datetime.timedelta(minutes=60)})]
    assert dist.agree_max(3.0) == 3.0
    (tensor,), kwargs = all_reduce.calls[0]
    assert tensor.device.type == "cpu" and kwargs["group"] == "host group"
    dist.barrier()
    assert barrier.calls == [((), {"group": "host group"})]
    Distributed({"device": "cuda", "backend": "nccl"}, timeout_min=5)
    assert init.calls[1][1]["timeout"] == datetime.timedelta(minutes=5)


class FakeDist:
    def __init__(self, rank: int, log: list[str]) -> None:
        self.rank, self.world, self.enabled, self.log = rank, 2, True, log
        self.device = torch.device("cpu")

    def barrier(self) -> None:
        self.log.append(f"barrier {self.rank}")

    def synchronize(self) -> None:
        pass


@pytest.mark.parametrize("rank", [0, 1])
def test_every_rank_meets_after_rank_0s_evaluate(rank):
    """C7: the other ranks wait for rank 0's evaluate() in a barrier, not in DDP's next
    all-reduce (which NCCL's watchdog ends)."""
    log: list[str] = []

    def user_evaluate(model: torch.nn.Module) -> float:
        log.append("evaluate")
        return 0.25

    session = types.SimpleNamespace(user=types.SimpleNamespace(evaluate=user_evaluate),
                                    model=torch.nn.Linear(2, 2), plain=None, dist=FakeDist(rank, log))
    session.evaluation_model = lambda: Session.evaluation_model(session)  # type: ignore[arg-type]
    metric = evaluate(session)  # type: ignore[arg-type]
    assert log == (["evaluate", "barrier 0"] if rank == 0 else ["barrier 1"])
    assert metric == (0.25 if rank == 0 else None)


# --- W5: served windows start together --------------------------------------------------------


def test_a_window_starts_its_clock_after_every_rank_is_there(tmp_path):
    log: list[str] = []

    def run_steps(n: int) -> tuple[float, list[float]]:
        log.append(f"run_steps {n}")
        return 1.0, [0.5] * n

    session = types.SimpleNamespace(dist=FakeDist(0, log), run_steps=run_steps, global_batch=8)
    worker.window(session, 5, 0, worker.Events(str(tmp_path / "events.jsonl"), rank=0))  # type: ignore[arg-type]
    assert log == ["barrier 0", "run_steps 5"]


# --- W2, C1: the timed clock of train_tuned.py ---------------------------------------------------


class SlowCheckpoints(Checkpoints):
    """A save at step 10 that takes ``seconds``."""

    def __init__(self, seconds: float) -> None:
        super().__init__(None, every=0, keep=0)
        self.seconds = seconds

    def due(self, step: int, *, per_epoch: int | None, last: bool) -> bool:
        return step == 10

    def save(self, session: Session, *, step: int, config: dict) -> str | None:
        import time

        time.sleep(self.seconds)
        return None


def test_the_timed_rate_leaves_out_evaluate_and_checkpoint_saves(tmp_path, in_process, monkeypatch):
    """W2: 20 steps cross two epoch ends, each with an evaluate() of 1,000 s, and a checkpoint
    save of 1,000 s: the samples/s is that of the steps alone, whatever the epoch ends crossed.
    The pauses advance the train clock instead of sleeping (no test waits, or races a busy
    machine's clock)."""
    import time
    import types

    from autotune.runtime import loop

    skipped = [0.0]
    monkeypatch.setattr(loop, "time", types.SimpleNamespace(
        perf_counter=lambda: time.perf_counter() + skipped[0]))
    monkeypatch.setattr(time, "sleep", lambda seconds: skipped.__setitem__(0, skipped[0] + seconds))
    session = Session(str(tiny_model(tmp_path, EVALUATE_S=1000.0)), {"batch_size": 4})
    report = tmp_path / "report.json"
    code = train(session, total=20, start=0, config={}, checkpoints=SlowCheckpoints(1000.0),
                 metrics=Metrics(None, tensorboard=None, enabled=False),
                 log_every=100, report=str(report))
    assert code == 0 and skipped[0] == 3000.0, "two evaluate() calls and one save ran"
    done = json.loads(report.read_text())
    elapsed = done["timed_steps"] * 4 / done["samples_per_s"]
    assert elapsed < 1000.0, f"{elapsed:.2f} s for {done['timed_steps']} steps of a 4x2 linear layer"


def test_train_can_skip_evaluate(tmp_path, in_process):
    session = Session(str(tiny_model(tmp_path, EVALUATE_RAISES=True)), {"batch_size": 4})
    code = train(session, total=10, start=0, config={}, checkpoints=Checkpoints(None, every=0, keep=0),
                 metrics=Metrics(None, tensorboard=None, enabled=False),
                 log_every=100, report=None, evaluate_each_epoch=False)
    assert code == 0


@pytest.mark.slow
def test_train_tuned_takes_no_evaluate_and_a_timeout(tmp_path):
    """W2, C7: the flags of the generated script (evaluate() here would raise)."""
    model = tiny_model(tmp_path, EVALUATE_RAISES=True)
    emit.write_script(tmp_path, cfg=TrialConfig(threads=1, batch_size=4), model_file=model, description="tiny")
    script = tmp_path / emit.SCRIPT_NAME
    env = {k: v for k, v in os.environ.items()
           if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "TUNED_NPROCS", "TUNED_STORE")}
    proc = subprocess.run([sys.executable, str(script), "--max-steps", "10", "--no-evaluate",
                           "--dist-timeout-min", "5", "--no-checkpoint", "--report", "r.json"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert json.loads((tmp_path / "r.json").read_text())["steps"] == 10


def test_the_standalone_pairs_run_the_scripts_without_evaluate(tmp_path):
    """W2: the timed runs of the emitted script and the baseline's skip evaluate()."""
    launcher = tmp_path / "launch.sh"
    launcher.write_text(textwrap.dedent('''\
        #!/usr/bin/env bash
        printf '%s\\n' "$@" > "$(dirname "$0")/args.txt"
        while [ $# -gt 0 ]; do
          if [ "$1" = --report ]; then echo '{"samples_per_s": 1.0}' > "$2"; fi
          shift
        done
    '''))
    report = run_launcher(launcher, steps=5, workdir=tmp_path / "work", timeout_s=60, cwd=tmp_path)
    assert report == ScriptReport(samples_per_s=1.0)
    assert "--no-evaluate" in (tmp_path / "args.txt").read_text().splitlines()
