"""The training runtime: apply a configuration's in-process knobs and train.

Shared by the trial worker (which measures) and the generated ``train_tuned.py``
(which trains): ``autotune.emit`` copies this file's text into the script, so the
script reproduces exactly what was measured. Hence this module imports nothing
from autotune and takes its configuration as a plain dict.

Two things run at import, before ``import torch``. With ``TUNED_NPROCS=n`` and no rank
yet, this process starts its own command line n times as the ranks and exits as they
did (``start_ranks``). Then core pinning, which must come before torch starts its
OpenMP pool: the launcher passes each local rank's cores in ``TUNED_CPUS_PER_RANK``
("0-3;4-7": one list per local rank).
"""
from __future__ import annotations

import os


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


RANKS_PREFIX = "tuned ranks: "


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
    import shutil
    import signal
    import subprocess
    import sys
    import tempfile
    import time

    def die_with_parent() -> None:  # a rank must not outlive this launcher
        try:
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass

    folder = tempfile.mkdtemp(prefix="tuned-ranks-")
    argv = [sys.executable, *sys.orig_argv[1:]]
    ranks = []
    for rank in range(n):
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(n),
               "LOCAL_WORLD_SIZE": str(n), "TUNED_STORE": os.path.join(folder, "store")}
        env.setdefault("OMP_NUM_THREADS", "1")  # torchrun's default for several ranks
        ranks.append(subprocess.Popen(argv, env=env, preexec_fn=die_with_parent))

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


start_ranks()
pin_local_rank()

import contextlib  # noqa: E402  (after pinning on purpose)
import importlib.util  # noqa: E402
import math  # noqa: E402
import random  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable, Iterator  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402


class NonFiniteLoss(RuntimeError):
    """The loss became NaN or infinite."""


def load_user_module(path: str) -> Any:
    """Import the user's model file by path; it never needs to be a package."""
    path = os.path.abspath(path)
    name = "user_model_" + os.path.splitext(os.path.basename(path))[0].replace("-", "_")
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    # The file's own folder first, so it can import its neighbours as it would when run.
    sys.path.insert(0, os.path.dirname(path))
    sys.modules[name] = module
    spec.loader.exec_module(module)
    # DataLoader workers started with spawn/forkserver unpickle the dataset by module name.
    return module


def seed_everything(seed: int) -> None:
    """Seed Python's and torch's generators, so runs with one seed start alike."""
    random.seed(seed)
    torch.manual_seed(seed)


def set_tf32(*, matmul: bool | None = None, cudnn: bool | None = None) -> None:
    """Allow or forbid TF32 in CUDA matmuls and in cuDNN (convolutions and RNNs); None
    leaves one as it is. Through the ``fp32_precision`` API where torch has it, and the
    legacy ``allow_tf32`` flags as well: in torch 2.9-2.13, setting only the new API makes
    every reader of the legacy one raise "mix of the legacy and new APIs", and torch's own
    inductor is such a reader (``torch.get_float32_matmul_precision()`` in its autotune
    cache, ``cudnn.allow_tf32`` in its convolution lowering)."""
    if matmul is not None:
        if hasattr(torch.backends.cuda.matmul, "fp32_precision"):
            torch.backends.cuda.matmul.fp32_precision = "tf32" if matmul else "ieee"
        torch.backends.cuda.matmul.allow_tf32 = matmul
    if cudnn is not None:
        for op in ("conv", "rnn"):
            flags = getattr(torch.backends.cudnn, op, None)
            if flags is not None and hasattr(flags, "fp32_precision"):
                flags.fp32_precision = "tf32" if cudnn else "ieee"
        torch.backends.cudnn.allow_tf32 = cudnn


def apply_process_knobs(cfg: dict, *, strict_fp32: bool = False) -> None:
    """Knobs that must be set before any parallel work in this process.

    On CUDA, PyTorch's defaults stay unless a knob says otherwise: they are what the
    user's own script runs with (cuDNN TF32 on, matmul TF32 off, no cuDNN benchmark), so
    the baseline and every fp32 configuration must keep them or the speedups are measured
    against a slower baseline. "tf32" adds matmul TF32 to them. ``strict_fp32`` forces
    IEEE fp32 everywhere: the numerics check compares trajectories with true fp32
    arithmetic, not with cuDNN's TF32 convolutions."""
    if cfg.get("threads"):
        torch.set_num_threads(int(cfg["threads"]))
    if cfg.get("interop_threads"):
        torch.set_num_interop_threads(int(cfg["interop_threads"]))
    if cfg.get("device") == "cuda":
        if cfg.get("cudnn_benchmark"):
            torch.backends.cudnn.benchmark = True
        if strict_fp32:
            set_tf32(matmul=False, cudnn=False)
        elif cfg.get("precision") == "tf32":
            set_tf32(matmul=True)


DIST_TIMEOUT_MIN = 60.0


class Distributed:
    """This process's place in the job: rank, world size, device.

    ``timeout_min`` bounds every collective: a rank waits that long for the others (in a
    barrier while rank 0 evaluates, say) before the job is torn down. NCCL's own default,
    10 minutes, is shorter than many a validation pass."""

    def __init__(self, cfg: dict, *, timeout_min: float = DIST_TIMEOUT_MIN) -> None:
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self._host_group: Any = None
        if cfg.get("device") == "cuda":
            self.device = torch.device("cuda", self._cuda_index())
            torch.cuda.set_device(self.device)
        else:
            self.device = torch.device("cpu")
        self.enabled = self.world > 1
        if self.enabled:
            import datetime

            timeout = datetime.timedelta(minutes=timeout_min)
            backend = cfg.get("backend", "gloo")
            if backend == "ccl":
                import oneccl_bindings_for_pytorch  # noqa: F401  (registers the backend)
            store = os.environ.get("TUNED_STORE")
            if store:  # ranks started by start_ranks: a file store, nothing listening
                torch.distributed.init_process_group(backend=backend, init_method=f"file://{store}",
                                                     rank=self.rank, world_size=self.world,
                                                     timeout=timeout)
            else:  # under the user's own launcher (torchrun, a cluster job)
                torch.distributed.init_process_group(backend=backend, timeout=timeout)
            if backend == "nccl":
                # Agreement on host values (a stop request, a window's start) over gloo
                # on CPU tensors: through NCCL each one would wait for the GPU's queue
                # to drain (all-reduce on the device, then .item()). Every rank creates
                # it here, at the same point: new_group is collective.
                self._host_group = torch.distributed.new_group(backend="gloo", timeout=timeout)

    def _cuda_index(self) -> int:
        """This rank's GPU: the local rank modulo the visible GPUs. Under a per-task GPU
        binding (Slurm's --gpus-per-task) each rank sees its own GPU as cuda:0 while its
        local rank goes up to the ranks per node. Ranks that start_ranks started
        (``TUNED_STORE``) all see every GPU of this machine, and two of them on one GPU
        would stop in NCCL's "duplicate GPU": refused here, saying what to change."""
        count = torch.cuda.device_count()
        if os.environ.get("TUNED_STORE") and self.world > count:
            raise RuntimeError(
                f"this configuration runs {self.world} ranks, one GPU each, but {count} GPU(s) "
                f"are visible here: run at most {count} ranks (TUNED_NPROCS={count}, e.g. "
                f"TUNED_NPROCS={count} ./launch.sh) or make more GPUs visible (CUDA_VISIBLE_DEVICES)")
        return self.local_rank % count if count else self.local_rank

    def agree_max(self, value: float) -> float:
        """The largest of the ranks' values, so every rank takes the same decision. On the
        host: the value is a host value, and no GPU work has to finish for it."""
        if not self.enabled:
            return value
        t = torch.tensor([value], dtype=torch.float64)
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX, group=self._host_group)
        return float(t.item())

    def barrier(self) -> None:
        """Every rank gets here before any goes on; on the host, as agree_max."""
        if self.enabled:
            torch.distributed.barrier(group=self._host_group)

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def close(self) -> None:
        if self.enabled and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def tensors(obj: Any) -> Iterator[torch.Tensor]:
    """The tensors in a batch or item (a tensor, or lists, tuples and dicts of them),
    depth first."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (dict, list, tuple)):
        for item in obj.values() if isinstance(obj, dict) else obj:
            yield from tensors(item)


def first_tensor(obj: Any) -> torch.Tensor | None:
    """The first tensor in a batch or item, or None if it holds none."""
    return next(tensors(obj), None)


def unwrap_model(model: torch.nn.Module) -> torch.nn.Module:
    """The user's own model inside the wrappers build_model adds: torch.compile's
    OptimizedModule (its ``_orig_mod``) and DistributedDataParallel (its ``.module``).
    Its state_dict has the user's parameter names, without the wrappers' prefixes, and
    calling it runs no DDP gradient synchronisation."""
    model = getattr(model, "_orig_mod", model)
    if isinstance(model, (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)):
        model = model.module
    return model


def move(obj: Any, device: torch.device, *, channels_last: bool = False) -> Any:
    """Move nested tensors to the device; 4-D float inputs go channels_last if asked."""
    if isinstance(obj, torch.Tensor):
        non_blocking = device.type == "cuda"
        if channels_last and obj.dim() == 4 and obj.is_floating_point():
            return obj.to(device, non_blocking=non_blocking, memory_format=torch.channels_last)
        return obj.to(device, non_blocking=non_blocking)
    if isinstance(obj, dict):
        return {k: move(v, device, channels_last=channels_last) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(move(v, device, channels_last=channels_last) for v in obj)
    return obj


def call_model(model: torch.nn.Module, inputs: Any) -> Any:
    """Call the model on a batch's inputs: a dict as keyword arguments, a list or tuple
    as positional arguments, anything else as the one argument."""
    if isinstance(inputs, dict):
        return model(**inputs)
    if isinstance(inputs, (list, tuple)):
        return model(*inputs)
    return model(inputs)


def prune_model(model: torch.nn.Module, ratio: float, example_inputs: Any) -> None:
    """Remove channels physically with Torch-Pruning; the output layer is kept."""
    import torch_pruning as tp

    ignored = []
    for module in reversed(list(model.modules())):
        if isinstance(module, (torch.nn.Linear, torch.nn.Conv2d, torch.nn.Conv1d)):
            ignored.append(module)  # the last layer maps to the task's outputs
            break
    pruner = tp.pruner.BasePruner(
        model,
        example_inputs,
        importance=tp.importance.GroupMagnitudeImportance(p=2),
        pruning_ratio=ratio,
        ignored_layers=ignored,
    )
    with torch.enable_grad():
        pruner.step()


class GlobalBatchSampler(torch.utils.data.Sampler):
    """Shuffled indices such that each global batch is the same whatever the layout:
    global batch b is split into equal contiguous chunks, one per rank. A 2-rank run
    therefore trains on exactly the batches of a 1-process run with the same seed."""

    def __init__(self, n: int, *, global_batch: int, world: int, rank: int, seed: int) -> None:
        self.n, self.global_batch, self.world, self.rank = n, global_batch, world, rank
        self.seed, self.epoch = seed, 0
        self.per_rank = global_batch // world
        self.batches_per_epoch = n // global_batch
        self.skip = 0  # batches of the next epoch already trained on (a resumed run)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return (self.batches_per_epoch - self.skip) * self.per_rank

    def __iter__(self) -> Iterator[int]:
        g = torch.Generator()
        g.manual_seed(self.seed + self.epoch)
        order = torch.randperm(self.n, generator=g).tolist()
        lo = self.rank * self.per_rank
        first, self.skip = self.skip, 0
        for b in range(first, self.batches_per_epoch):
            start = b * self.global_batch + lo
            yield from order[start : start + self.per_rank]


WORKER_GRACE_S = 5


def leave_stop_signals_to_the_trainer(worker_id: int) -> None:
    """In a DataLoader worker: SIGTERM or SIGINT ends it only ``WORKER_GRACE_S`` later. A
    scheduler that signals every process of a job (Slurm does) or Ctrl-C at a terminal
    would otherwise end the workers under the step the trainer finishes before it saves.
    Ignoring the signals outright would not do: the DataLoader and multiprocessing end
    their workers with SIGTERM too, and wait for them."""
    import signal

    def later(signum: int, frame: object) -> None:
        signal.alarm(WORKER_GRACE_S)  # SIGALRM's default action ends the worker

    signal.signal(signal.SIGTERM, later)
    signal.signal(signal.SIGINT, later)


class IterableShard(torch.utils.data.IterableDataset):
    """One DataLoader worker's share of one rank's share of the user's IterableDataset,
    so that the user's dataset need not shard itself.

    The stream is cut into global batches, as the GlobalBatchSampler cuts a map-style
    dataset: rank r takes the r-th contiguous chunk of each, and of a rank's batches
    worker w makes every w-th (the DataLoader takes batches from its workers in turn).
    So every layout and worker count trains on the global batches of one process, in
    its order. Each (rank, worker) slot reads the whole stream and keeps its part: the
    stream must yield the same items in the same order in every process. Inside the
    user's code get_worker_info() answers None, as in one process: a dataset that
    splits itself among workers (PyTorch's docs show one; Hugging Face streaming
    datasets do) would otherwise hand each slot a part of which it kept a part.
    A trailing partial global batch is dropped on every rank alike: ranks that made
    different numbers of steps would wait for each other in DDP for ever."""

    def __init__(self, dataset: Any, *, global_batch: int, world: int, rank: int) -> None:
        self.dataset = dataset
        self.global_batch, self.world, self.rank = global_batch, world, rank
        self.per_rank = global_batch // world
        self.epoch = 0
        # A persistent worker's copy never hears set_epoch: an iteration it was not
        # told about is the next epoch.
        self._told = True

    def set_epoch(self, epoch: int) -> None:
        self.epoch, self._told = epoch, True

    def __len__(self) -> int:
        # Items this rank's loader yields; a TypeError where the user's dataset has no length.
        return len(self.dataset) // self.global_batch * self.per_rank

    def __iter__(self) -> Iterator[Any]:
        info = torch.utils.data.get_worker_info()
        workers, worker = (info.num_workers, info.id) if info is not None else (1, 0)
        if not self._told:
            self.epoch += 1
        self._told = False
        set_epoch = getattr(self.dataset, "set_epoch", None)
        if callable(set_epoch):
            set_epoch(self.epoch)
        first = worker * self.global_batch + self.rank * self.per_rank  # within a cycle of workers
        cycle = self.global_batch * workers
        kept: list[Any] = []
        seen = 0
        for i, item in enumerate(self._whole_stream()):
            seen = i + 1
            if first <= i % cycle < first + self.per_rank:
                kept.append(item)
            if seen % self.global_batch == 0:  # a global batch is complete: its part goes out
                yield from kept
                kept = []
        if seen < self.global_batch:
            raise ValueError(f"the dataset yielded {seen} items: too few for one batch of "
                             f"{self.global_batch}")

    def _whole_stream(self) -> Iterator[Any]:
        """The user's items as one process reads them (see the class's note)."""
        end = object()
        with self._as_one_process():
            iterator = iter(self.dataset)
        while True:
            with self._as_one_process():
                item = next(iterator, end)
            if item is end:
                return
            yield item

    @staticmethod
    @contextlib.contextmanager
    def _as_one_process() -> Iterator[None]:
        """get_worker_info() answers None within: the user's code sees one process."""
        from torch.utils.data._utils import worker as state

        if not hasattr(state, "_worker_info"):  # a torch that keeps it elsewhere: nothing hidden
            yield
            return
        saved, state._worker_info = state._worker_info, None
        try:
            yield
        finally:
            state._worker_info = saved


def build_loader(user: Any, cfg: dict, dist: Distributed, *, seed: int) -> tuple[Any, Any]:
    """The real DataLoader the user would train with, sharded over ranks; and its
    sampler, None for an IterableDataset (sharded by IterableShard instead)."""
    dataset = user.build_dataset()
    global_batch = int(cfg["batch_size"])
    sampler: GlobalBatchSampler | None = None
    if isinstance(dataset, torch.utils.data.IterableDataset):
        dataset = IterableShard(dataset, global_batch=global_batch, world=dist.world, rank=dist.rank)
        per_rank = dataset.per_rank
        items = _length(dataset.dataset)  # None: a stream of unknown length
    else:
        sampler = GlobalBatchSampler(
            len(dataset), global_batch=global_batch, world=dist.world, rank=dist.rank, seed=seed
        )
        per_rank = sampler.per_rank
        items = len(dataset)
    if items is not None and items < global_batch:
        raise ValueError(f"the dataset has {items} items: too few for one batch of {global_batch}")
    workers = int(cfg.get("num_workers", 0))
    kwargs: dict[str, Any] = {}
    if workers > 0:
        kwargs["worker_init_fn"] = leave_stop_signals_to_the_trainer
        kwargs["persistent_workers"] = bool(cfg.get("persistent_workers"))
        if cfg.get("prefetch_factor"):
            kwargs["prefetch_factor"] = int(cfg["prefetch_factor"])
    loader = torch.utils.data.DataLoader(
        dataset,
        batch_size=per_rank,
        sampler=sampler,
        num_workers=workers,
        pin_memory=bool(cfg.get("pin_memory")) and dist.device.type == "cuda",
        drop_last=True,  # a ragged last batch would recompile a compiled model
        collate_fn=getattr(user, "collate_fn", None),
        **kwargs,
    )
    return loader, sampler


def batches(loader: Any, sampler: Any, *, start_epoch: int = 0) -> Iterator[Any]:
    """Endless batches, epoch after epoch, as a training loop would draw them. Without a
    sampler (an IterableDataset), a dataset with ``set_epoch`` is told the epoch."""
    epoch = start_epoch
    while True:
        if sampler is not None:
            sampler.set_epoch(epoch)
        set_epoch = getattr(loader.dataset, "set_epoch", None)
        if sampler is None and callable(set_epoch):
            set_epoch(epoch)
        yield from loader
        epoch += 1


def sync_batchnorm(model: torch.nn.Module, device: torch.device, world: int) -> torch.nn.Module:
    """BatchNorm layers as SyncBatchNorm on several CUDA ranks: their statistics then cover
    the global batch, as in one process, so a layout of several GPUs trains the same model
    as one. SyncBatchNorm runs on CUDA only: elsewhere the model is left as it is."""
    if device.type != "cuda" or world <= 1:
        return model
    return torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)


def build_model(user: Any, cfg: dict, dist: Distributed, example_batch: Any) -> tuple[Any, Any]:
    """Model and optimizer with every in-process knob applied, in the order that works:
    prune, then memory format, SyncBatchNorm and device, then optimizer, IPEX, DDP and
    compile."""
    model = user.build_model()
    prune_ratio = float(cfg.get("prune_ratio") or 0.0)
    if prune_ratio > 0:
        inputs = example_batch[0] if isinstance(example_batch, (list, tuple)) else example_batch
        prune_model(model, prune_ratio, inputs)
    if cfg.get("channels_last"):
        model = model.to(memory_format=torch.channels_last)
    model = sync_batchnorm(model, dist.device, dist.world)
    model = model.to(dist.device)
    model.train()
    make_optimizer = getattr(user, "build_optimizer", None)
    optimizer = (
        make_optimizer(model.parameters())
        if make_optimizer
        else torch.optim.AdamW(model.parameters(), lr=1e-3)
    )
    if cfg.get("ipex"):
        import intel_extension_for_pytorch as ipex

        dtype = torch.bfloat16 if cfg.get("precision") == "bf16" else None
        model, optimizer = ipex.optimize(model, optimizer=optimizer, dtype=dtype)
    if dist.enabled:
        ids = [dist.device.index] if dist.device.type == "cuda" else None
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=ids)
    mode = cfg.get("compile", "off")
    if mode != "off":
        model = torch.compile(model, mode=None if mode == "default" else mode)
    return model, optimizer


def autocast(cfg: dict, device: torch.device) -> contextlib.AbstractContextManager:
    """The autocast context of the configuration's precision (none for fp32 and tf32)."""
    precision = cfg.get("precision", "fp32")
    if precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    if precision == "fp16":
        return torch.autocast(device.type, dtype=torch.float16)
    return contextlib.nullcontext()


def make_scaler(cfg: dict, device: torch.device) -> torch.amp.GradScaler | None:
    """fp16 needs its loss scaled; the other precisions do not."""
    return torch.amp.GradScaler(device.type) if cfg.get("precision") == "fp16" else None


def make_step(user: Any, model: Any, optimizer: Any, cfg: dict, device: torch.device, *,
              scaler: torch.amp.GradScaler | None = None) -> Callable[[Any], torch.Tensor]:
    """A function doing one optimizer step on one batch (moved to ``device``); it returns
    the loss as a detached tensor so the caller decides when to synchronise with the device.

    The callers keep losses across steps and read them later (a window's, a log
    interval's). So the loss returned is a copy: under compile=reduce-overhead a loss
    computed inside the compiled model (``training_step = model(**batch).loss``) is an
    output of a CUDA graph, whose memory the next replay overwrites, and reading it then
    raises. Each step also tells the CUDA graph trees that a new iteration begins."""
    loss_fn = getattr(user, "loss_fn", None) or torch.nn.functional.cross_entropy
    training_step = getattr(user, "training_step", None)
    channels_last = bool(cfg.get("channels_last"))
    graphs = cfg.get("compile") == "reduce-overhead"

    def step(batch: Any) -> torch.Tensor:
        if graphs:
            torch.compiler.cudagraph_mark_step_begin()
        batch = move(batch, device, channels_last=channels_last)
        optimizer.zero_grad(set_to_none=True)
        with autocast(cfg, device):
            if training_step is not None:
                loss = training_step(model, batch)
            else:
                inputs, targets = batch
                loss = loss_fn(call_model(model, inputs), targets)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        else:
            loss.backward()
            optimizer.step()
        return loss.detach().clone()

    return step


def _length(loader: Any) -> int | None:
    try:
        return len(loader)
    except TypeError:
        return None


def check_finite(losses: list[torch.Tensor]) -> list[float]:
    """The losses as floats (this synchronises with the device, once: a float() per
    loss would wait for the device once per loss); raises NonFiniteLoss at the first NaN
    or infinite one."""
    if not losses:
        return []
    values = [float(v) for v in torch.stack([v.reshape(()) for v in losses]).tolist()]
    for i, v in enumerate(values):
        if not math.isfinite(v):
            raise NonFiniteLoss(f"loss became {v} at step {i} of the window")
    return values


def machine_differences(tuned_for: dict) -> list[str]:
    """Cheap checks that this machine is the kind the configuration was tuned on: a
    config tuned for 16 cores and run on 4 is no longer the fastest."""
    here = {"usable_cores": len(os.sched_getaffinity(0)),
            "torch_version": torch.__version__,
            "gpu_count": torch.cuda.device_count() if torch.cuda.is_available() else 0}
    try:
        with open("/proc/cpuinfo") as f:
            models = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        here["cpu_model"] = models[0] if models else None
    except OSError:
        pass
    return [f"{key}: tuned on {tuned_for[key]!r}, here {value!r}" for key, value in here.items()
            if key in tuned_for and tuned_for[key] is not None and value is not None
            and tuned_for[key] != value]


def mapped_libraries() -> list[str]:
    """Shared objects mapped into this process: shows which allocator is loaded."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if ".so" in line}
    except OSError:
        return []
    return sorted(os.path.basename(p) for p in paths if p.startswith("/"))


def process_facts() -> dict[str, Any]:
    """What the process-level knobs did to this process."""
    return {
        "threads": torch.get_num_threads(),
        "interop_threads": torch.get_num_interop_threads(),
        "affinity": sorted(os.sched_getaffinity(0)),
        "libraries": mapped_libraries(),
        "env": {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "LD_PRELOAD", "MALLOC_CONF",
                                                "OMP_PROC_BIND", "OMP_PLACES", "TUNED_CPUS_PER_RANK")},
    }


def step_facts(session: Session) -> tuple[torch.Tensor, dict[str, Any]]:
    """Run one training step (its loss is returned) with hooks that record what the
    in-process knobs did:
    activation dtypes (precision), memory format of conv inputs (channels_last), the
    per-rank batch, layer widths (pruning), compiled and DDP wrappers."""
    dtypes: set[str] = set()
    conv_inputs_channels_last: list[bool] = []
    hooks = []

    def record(module: torch.nn.Module, args: tuple, output: Any) -> None:
        if isinstance(output, torch.Tensor) and output.is_floating_point():
            dtypes.add(str(output.dtype).replace("torch.", ""))
        # A 1-channel input is trivially channels_last: only wider inputs tell.
        if (isinstance(module, torch.nn.Conv2d) and module.in_channels > 1
                and args and isinstance(args[0], torch.Tensor)):
            conv_inputs_channels_last.append(args[0].is_contiguous(memory_format=torch.channels_last))

    compiled = type(session.model).__name__ == "OptimizedModule"
    uncompiled = getattr(session.model, "_orig_mod", session.model)
    base = unwrap_model(session.model)
    # Hooks on a compiled model would make dynamo recompile twice (on adding and on
    # removing them), inside the warm-up that calibrates the windows: not for them.
    for module in base.modules() if not compiled else ():
        if not list(module.children()):
            hooks.append(module.register_forward_hook(record))
    batch = session.next_batch()
    first = first_tensor(batch)
    try:
        loss = session.train_step(batch)
    finally:
        for h in hooks:
            h.remove()
    return loss, {
        "activation_dtypes": sorted(dtypes),
        "conv_inputs_channels_last": conv_inputs_channels_last[:1],
        "per_rank_batch": int(first.shape[0]) if first is not None and first.dim() > 0 else None,
        "layer_widths": {
            name: (m.out_channels if hasattr(m, "out_channels") else m.out_features)
            for name, m in base.named_modules()
            if isinstance(m, (torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d, torch.nn.Linear))
        },
        "parameters": sum(p.numel() for p in base.parameters()),
        "compiled": compiled,
        "ddp": isinstance(uncompiled, torch.nn.parallel.DistributedDataParallel),
        "world": session.dist.world,
        "backend": torch.distributed.get_backend() if session.dist.enabled else None,
    }


class Session:
    """Everything one rank needs to train: model, optimizer, data, step."""

    def __init__(self, model_file: str, cfg: dict, *, seed: int = 0, start_step: int = 0,
                 strict_fp32: bool = False, dist_timeout_min: float = DIST_TIMEOUT_MIN) -> None:
        self.cfg = cfg
        apply_process_knobs(cfg, strict_fp32=strict_fp32)
        self.dist = Distributed(cfg, timeout_min=dist_timeout_min)
        seed_everything(seed)
        self.user = load_user_module(model_file)
        self.loader, self.sampler = build_loader(self.user, cfg, self.dist, seed=seed)
        # Batches per epoch; None for an IterableDataset without a length.
        self.per_epoch: int | None = (self.sampler.batches_per_epoch if self.sampler is not None
                                      else _length(self.loader))
        self.batches = self._batches_from(start_step)
        first = next(self.batches)
        seed_everything(seed)  # identical initial weights whatever the loader consumed
        self.model, self.optimizer = build_model(self.user, cfg, self.dist, first)
        self.scaler = make_scaler(cfg, self.dist.device)
        # One optimizer step on a given batch; step() takes the next batch of the loader.
        self.train_step = make_step(self.user, self.model, self.optimizer, cfg, self.dist.device,
                                    scaler=self.scaler)
        self._pending = [first]
        self.global_batch = int(cfg["batch_size"])

    def _batches_from(self, step: int) -> Iterator[Any]:
        """The batches a run that already trained ``step`` steps draws next: the sampler
        skips to them; a dataset without one is read through to them."""
        if self.sampler is not None and self.per_epoch:
            epoch, self.sampler.skip = divmod(step, self.per_epoch)
            return batches(self.loader, self.sampler, start_epoch=epoch)
        endless = batches(self.loader, self.sampler)
        for _ in range(step):
            next(endless)
        return endless

    def next_batch(self) -> Any:
        """The next batch to train on: the one drawn to build the model comes first."""
        return self._pending.pop() if self._pending else next(self.batches)

    def step(self) -> torch.Tensor:
        """One optimizer step on the next batch; returns its loss, not synchronised."""
        return self.train_step(self.next_batch())

    def run_steps(self, n: int) -> tuple[float, list[float]]:
        """n steps, then a device synchronize; returns (wall seconds, losses)."""
        start = time.perf_counter()
        losses = [self.step() for _ in range(n)]
        self.dist.synchronize()
        elapsed = time.perf_counter() - start
        return elapsed, check_finite(losses)

    def close(self) -> None:
        self.dist.close()


# --- training: the loop of train_tuned.py --------------------------------------------

CHECKPOINT_NAME = "step-{step:09d}.pt"
STOP_SIGNALS = ("SIGTERM", "SIGINT")
# With several ranks, a stop request is agreed on every this many steps: the ranks must
# stop after the same step, and a collective every step would slow what was tuned.
STOP_CHECK_EVERY = 10


def rng_state(device: torch.device) -> dict[str, Any]:
    """Every random generator a training step may draw from, as saved in a checkpoint."""
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        state["numpy"] = numpy.random.get_state()
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict[str, Any], device: torch.device) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    numpy = sys.modules.get("numpy")
    if numpy is not None and "numpy" in state:
        numpy.random.set_state(state["numpy"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


def latest_checkpoint(folder: str) -> str | None:
    """The checkpoint of the most steps in ``folder``; None when there is none."""
    if not os.path.isdir(folder):
        return None
    names = sorted(n for n in os.listdir(folder) if n.startswith("step-") and n.endswith(".pt"))
    return os.path.join(folder, names[-1]) if names else None


def read_checkpoint(path: str) -> dict[str, Any]:
    """A checkpoint this script wrote (it holds RNG states, so it is not weights-only)."""
    return torch.load(path, map_location="cpu", weights_only=False)


class Checkpoints:
    """Where and when rank 0 saves: every ``every`` steps (0: at each epoch's end), at the
    last step, and when a stop signal arrives; the newest ``keep`` are kept (0: all).
    Every rank takes part (their RNG states are gathered)."""

    def __init__(self, folder: str | None, *, every: int, keep: int) -> None:
        self.folder, self.every, self.keep = folder, every, keep

    def due(self, step: int, *, per_epoch: int | None, last: bool) -> bool:
        if self.folder is None:
            return False
        if last:
            return True
        if self.every:
            return step % self.every == 0
        return per_epoch is not None and step % per_epoch == 0

    def save(self, session: Session, *, step: int, config: dict) -> str | None:
        states: list[Any] = [rng_state(session.dist.device)]
        if session.dist.enabled:
            states = [None] * session.dist.world
            torch.distributed.all_gather_object(states, rng_state(session.dist.device))
        if session.dist.rank != 0 or self.folder is None:
            return None
        os.makedirs(self.folder, exist_ok=True)
        path = os.path.join(self.folder, CHECKPOINT_NAME.format(step=step))
        state = {"step": step, "model": unwrap_model(session.model).state_dict(),
                 "optimizer": session.optimizer.state_dict(),
                 "scaler": session.scaler.state_dict() if session.scaler is not None else None,
                 "rng": states, "world": session.dist.world, "config": config}
        tmp = f"{path}.{os.getpid()}.tmp"
        torch.save(state, tmp)
        os.replace(tmp, path)  # a kill mid-save leaves the previous checkpoint intact
        if self.keep:
            names = sorted(n for n in os.listdir(self.folder) if n.startswith("step-") and n.endswith(".pt"))
            for old in names[: -self.keep]:
                os.remove(os.path.join(self.folder, old))
        return path


def restore(session: Session, state: dict[str, Any]) -> list[str]:
    """Load a checkpoint into a session built at its step; returns warnings."""
    warnings = []
    unwrap_model(session.model).load_state_dict(state["model"])
    session.optimizer.load_state_dict(state["optimizer"])
    if session.scaler is not None and state.get("scaler"):
        session.scaler.load_state_dict(state["scaler"])
    states = state["rng"]
    if len(states) != session.dist.world:
        warnings.append(f"the checkpoint was saved by {len(states)} rank(s), this run has "
                        f"{session.dist.world}: random streams continue from rank 0's")
    set_rng_state(states[session.dist.rank] if session.dist.rank < len(states) else states[0],
                  session.dist.device)
    return warnings


class Metrics:
    """Training metrics as JSON lines (appended: a resumed run continues the file), and
    TensorBoard scalars where a log dir is given and tensorboard is installed."""

    def __init__(self, path: str | None, *, tensorboard: str | None, enabled: bool) -> None:
        import json

        self._json = json
        self.file = None
        self.writer = None
        if not enabled:
            return
        if path:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            self.file = open(path, "a")  # noqa: SIM115  (held for the run, closed in close())
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                print("warning: --tensorboard needs the tensorboard package (pip install tensorboard); "
                      "metrics go to the JSON lines only", file=sys.stderr, flush=True)
            else:
                self.writer = SummaryWriter(tensorboard)

    def write(self, step: int, **values: Any) -> None:
        if self.file is not None:
            self.file.write(self._json.dumps({"step": step, "time": time.time(), **values}) + "\n")
            self.file.flush()
        if self.writer is not None:
            for key, value in values.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    self.writer.add_scalar(key, value, step)

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
        if self.writer is not None:
            self.writer.close()


class StopRequest:
    """SIGTERM or SIGINT (a preempted job, Ctrl-C) asks the loop to stop after the
    current step and save; a second one is left to the default action."""

    def __init__(self) -> None:
        import signal

        self.signum = 0
        for name in STOP_SIGNALS:
            signal.signal(getattr(signal, name), self._handle)

    def _handle(self, signum: int, frame: object) -> None:
        import signal

        self.signum = signum
        signal.signal(signum, signal.SIG_DFL)

    def agreed(self, session: Session, step: int) -> int:
        """The signal every rank stops for after ``step`` (0: go on)."""
        if not session.dist.enabled:
            return self.signum
        if step % STOP_CHECK_EVERY:
            return 0
        return int(session.dist.agree_max(float(self.signum)))


def evaluate(session: Session) -> float | None:
    """The user's evaluate(model) on rank 0: the model unwrapped, on its training device,
    back in training mode after it. The other ranks wait for it in a barrier, on the
    host: waiting in the next step's all-reduce instead, they would be torn down by
    NCCL's watchdog during an evaluation longer than its timeout, and rank 0's next
    step would be timed against ranks that had already taken it."""
    user_evaluate = getattr(session.user, "evaluate", None)
    if user_evaluate is None:
        return None
    metric = None
    if session.dist.rank == 0:
        model = unwrap_model(session.model)
        try:
            metric = float(user_evaluate(model))
        finally:
            model.train()
    session.dist.barrier()
    return metric


class TrainClock:
    """The clock of train()'s samples/s: from the end of the warm-up steps to the last
    step, less what ``paused()`` kept out of it (evaluate(), checkpoint saves), so the
    rate is that of training alone, whatever the number of epoch ends a run crosses.
    Each edge waits for the device: work queued before a pause is training's, work
    queued inside it is not."""

    def __init__(self, dist: Distributed) -> None:
        self.dist = dist
        self.start = time.perf_counter()
        self.excluded = 0.0

    def restart(self) -> None:
        self.dist.synchronize()
        self.start = time.perf_counter()
        self.excluded = 0.0

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        self.dist.synchronize()
        began = time.perf_counter()
        try:
            yield
        finally:
            self.dist.synchronize()
            self.excluded += time.perf_counter() - began

    def elapsed(self) -> float:
        self.dist.synchronize()
        return time.perf_counter() - self.start - self.excluded


def train(session: Session, *, total: int, start: int, config: dict, checkpoints: Checkpoints,
          metrics: Metrics, log_every: int, report: str | None,
          evaluate_each_epoch: bool = True) -> int:
    """Train from step ``start`` (a resumed run) to ``total``; returns the exit code:
    0, or 128 + the signal after a stop request was saved. ``evaluate_each_epoch`` False
    skips evaluate() at epoch ends (a timed comparison of scripts does not need it)."""
    rank0 = session.dist.rank == 0
    per_epoch = session.per_epoch
    stop = StopRequest()
    warm = start + min(3, max(0, total - start - 1))  # steps before the clock starts (compile)
    losses: list[float] = []
    pending: list[torch.Tensor] = []
    facts = None
    clock = TrainClock(session.dist)
    stopped = 0
    step = start
    while step < total:
        step += 1
        if step == start + 1 and report:
            # The first step, with hooks that record what each knob did here, the way
            # autotune's trials record it.
            loss, facts = step_facts(session)
            facts.update(process_facts())
            pending.append(loss)
        else:
            pending.append(session.step())
        if step == warm:
            clock.restart()
        epoch = step // per_epoch if per_epoch else None
        epoch_end = per_epoch is not None and step % per_epoch == 0
        stopped = stop.agreed(session, step)
        last = step == total or bool(stopped)
        if step % log_every == 0 or last or epoch_end:
            losses.extend(check_finite(pending))
            pending = []
            if rank0 and (step % log_every == 0 or last):
                print(f"step {step}/{total}  loss {losses[-1]:.4f}", flush=True)
                metrics.write(step, loss=losses[-1], epoch=step / per_epoch if per_epoch else None)
        if epoch_end and evaluate_each_epoch:
            with clock.paused():
                metric = evaluate(session)
            if metric is not None:
                print(f"epoch {epoch}  evaluate {metric:.4f}", flush=True)
                metrics.write(step, evaluate=metric, epoch=epoch)
        if checkpoints.due(step, per_epoch=per_epoch, last=last):
            with clock.paused():
                path = checkpoints.save(session, step=step, config=config)
            if path:
                print(f"saved {path}", flush=True)
                metrics.write(step, checkpoint=path)
        if stopped:
            break
    elapsed = clock.elapsed()
    timed = step - warm
    samples_per_s = timed * session.global_batch / elapsed if timed > 0 and elapsed > 0 and not stopped else None
    if rank0:
        if stopped:
            import signal

            where = f"; resume with --resume {checkpoints.folder}" if checkpoints.folder else ""
            print(f"stopped by {signal.Signals(stopped).name} after step {step}{where}", flush=True)
        elif samples_per_s:
            print(f"{samples_per_s:.1f} samples/s over {timed} steps", flush=True)
        if report:
            import json

            with open(report, "w") as f:
                json.dump({"steps": step, "first_step": start + 1, "timed_steps": timed,
                           "samples_per_s": samples_per_s, "losses": losses, "facts": facts,
                           "stopped_by": stopped or None}, f)
    metrics.close()
    return 128 + stopped if stopped else 0
