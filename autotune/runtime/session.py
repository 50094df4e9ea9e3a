"""Everything one rank needs to train: the process's knobs, the user's model file, the
data, the model and its optimizer step, put together by ``Session``."""
from __future__ import annotations

import contextlib
import ctypes
import gc
import importlib.util
import multiprocessing
import os
import random
import sys
import time
from collections.abc import Generator
from typing import Any

import torch

from . import gpu_knobs
from .data import batches, build_loader, global_batch_size, length
from .distributed import DIST_TIMEOUT_MIN, Distributed
from .knobs import CompileMode, ConfigDict, Device, Precision
from .memory_knobs import gathered
from .model import build_model, check_finite, make_scaler, make_step, unwrap_model


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


def configure_precision(cfg: ConfigDict, *, strict_fp32: bool = False) -> None:
    """The process-wide float flags of ``cfg``'s precision, from PyTorch's defaults (see
    ``apply_process_knobs``): a process that trains several configurations one after
    another sets them for each."""
    if cfg.get("device") != Device.CUDA:
        return
    if strict_fp32:
        set_tf32(matmul=False, cudnn=False)
    else:
        set_tf32(matmul=cfg.get("precision") == Precision.TF32, cudnn=True)


def apply_process_knobs(cfg: ConfigDict, *, strict_fp32: bool = False) -> None:
    """Knobs that must be set before any parallel work in this process.

    On CUDA, PyTorch's defaults stay unless a knob says otherwise: they are what the
    user's own script runs with (cuDNN TF32 on, matmul TF32 off, no cuDNN benchmark), so
    the baseline and every fp32 configuration must keep them or the speedups are measured
    against a slower baseline. "tf32" adds matmul TF32 to them. ``strict_fp32`` forces
    IEEE fp32 everywhere: the numerics check compares trajectories with true fp32
    arithmetic, not with cuDNN's TF32 convolutions."""
    # before CUDA starts (Distributed sets the device), which reads the allocator's options once
    gpu_knobs.set_expandable_segments(cfg)
    threads, interop_threads = cfg.get("threads"), cfg.get("interop_threads")
    if threads:
        torch.set_num_threads(int(threads))
    if interop_threads:
        torch.set_num_interop_threads(int(interop_threads))
    if cfg.get("device") == Device.CUDA:
        if cfg.get("cudnn_benchmark"):
            torch.backends.cudnn.benchmark = True
        if strict_fp32:
            set_tf32(matmul=False, cudnn=False)
        elif cfg.get("precision") == Precision.TF32:
            set_tf32(matmul=True)


def shutdown_workers(loader: Any, *, timeout_s: float) -> None:
    """End ``loader``'s DataLoader workers and wait for them: a persistent loader keeps
    its iterator (and its workers) after its batches are abandoned, and an abandoned
    iterator ends its workers only once it is collected."""
    iterator = getattr(loader, "_iterator", None)
    if iterator is not None and hasattr(iterator, "_shutdown_workers"):
        iterator._shutdown_workers()
        loader._iterator = None
    gc.collect()
    deadline = time.monotonic() + timeout_s
    for child in multiprocessing.active_children():
        child.join(max(0.0, deadline - time.monotonic()))
        if child.is_alive():
            child.kill()
            child.join()


# jemalloc's "all arenas" index (MALLCTL_ARENAS_ALL) in its mallctl names.
_JEMALLOC_ALL_ARENAS = 4096


def return_freed_memory() -> None:
    """Give the memory freed by a finished configuration back to the system, whichever
    allocator holds it: glibc's (malloc_trim), tcmalloc's (ReleaseFreeMemory) or jemalloc's
    (a purge of every arena), found among the process's symbols where it was preloaded.
    The next configuration's memory, and its measured peak, are then its own, as in a
    fresh process."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    process = ctypes.CDLL(None)
    with contextlib.suppress(AttributeError):
        process.MallocExtension_ReleaseFreeMemory()
    with contextlib.suppress(AttributeError):
        mallctl = process.mallctl
        mallctl.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
        mallctl(f"arena.{_JEMALLOC_ALL_ARENAS}.purge".encode(), None, None, None, 0)


class ProcessSetup:
    """What one process sets up once and keeps for every configuration it trains: the
    process knobs, its place in the rank group, the user's module and data set. A trial
    process measures several configurations that share these one after another
    (``autotune.trials.worker``), each in a ``Session`` of its own."""

    def __init__(self, model_file: str, cfg: ConfigDict, *, seed: int = 0, strict_fp32: bool = False,
                 dist_timeout_min: float = DIST_TIMEOUT_MIN) -> None:
        apply_process_knobs(cfg, strict_fp32=strict_fp32)
        self.dist = Distributed(cfg, timeout_min=dist_timeout_min)
        seed_everything(seed)
        self.user = load_user_module(model_file)
        self.dataset = self.user.build_dataset()
        # Where the random generators stood once the data set was built: every session
        # starts from here, so a later configuration draws what a fresh process would.
        self._rng = (random.getstate(), torch.random.get_rng_state(),
                     torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None)

    def restore_rng(self) -> None:
        python, cpu, cuda = self._rng
        random.setstate(python)
        torch.random.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)

    def close(self) -> None:
        self.dist.close()


class Session:
    """Everything one rank needs to train one configuration: model, optimizer, data, step.
    ``setup``: a process's setup that an earlier session of it made (its process knobs
    are this configuration's); without one, the session makes its own."""

    def __init__(self, model_file: str, cfg: ConfigDict, *, seed: int = 0, start_step: int = 0,
                 strict_fp32: bool = False, dist_timeout_min: float = DIST_TIMEOUT_MIN,
                 setup: ProcessSetup | None = None) -> None:
        self.cfg = cfg
        self._owns_setup = setup is None
        if setup is None:
            setup = ProcessSetup(model_file, cfg, seed=seed, strict_fp32=strict_fp32,
                                 dist_timeout_min=dist_timeout_min)
        else:
            configure_precision(cfg, strict_fp32=strict_fp32)
            setup.restore_rng()
        self.setup = setup
        self.dist = setup.dist
        self.user = setup.user
        self.loader, self.sampler = build_loader(self.user, cfg, self.dist, seed=seed, dataset=setup.dataset)
        # Batches per epoch; None for an IterableDataset without a length.
        self.per_epoch: int | None = (self.sampler.batches_per_epoch if self.sampler is not None
                                      else length(self.loader))
        self.batches = self._batches_from(start_step)
        first = next(self.batches)
        seed_everything(seed)  # identical initial weights whatever the loader consumed
        self.model, self.optimizer, self.plain = build_model(self.user, cfg, self.dist, first)
        self.scaler = make_scaler(cfg, self.dist.device)
        # One optimizer step on a given batch; step() takes the next batch of the loader.
        self.train_step = make_step(self.user, self.model, self.optimizer, cfg, self.dist.device,
                                    scaler=self.scaler)
        self._pending = [first]
        self.global_batch = global_batch_size(cfg, self.dist)

    def _batches_from(self, step: int) -> Generator[Any, None, None]:
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

    def peek_batch(self) -> Any:
        """The batch next_batch() returns next, left there for it."""
        if not self._pending:
            self._pending.append(next(self.batches))
        return self._pending[-1]

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

    def evaluation_model(self) -> contextlib.AbstractContextManager[torch.nn.Module | None]:
        """The model the user's evaluate() takes, on rank 0 (None on the other ranks), as
        memory.gathered gives it: every rank enters, since a sharded model's weights are
        gathered from all of them."""
        return gathered(unwrap_model(self.model), self.plain, self.dist)

    def release(self, *, worker_timeout_s: float = 10.0) -> None:
        """Leave the process as the next configuration must find it: this one's DataLoader
        workers ended, its model, optimizer and compiled graphs gone, its memory returned
        (on CUDA: the caching allocator emptied, its peak statistics reset). The setup
        stays."""
        self.batches.close()  # the loader's iterator and, with it, its workers
        shutdown_workers(self.loader, timeout_s=worker_timeout_s)
        compiled = self.cfg.get("compile", CompileMode.OFF) != CompileMode.OFF
        self.loader = self.sampler = self.model = self.optimizer = self.scaler = self.plain = None
        self.train_step = None  # type: ignore[assignment]
        self._pending = []
        if compiled:
            torch._dynamo.reset()
        gc.collect()
        if self.dist.device.type == Device.CUDA:
            torch.cuda.synchronize(self.dist.device)
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(self.dist.device)
        return_freed_memory()

    def close(self) -> None:
        if self._owns_setup:
            self.setup.close()
