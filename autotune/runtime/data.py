"""The data side of training: the user's dataset as a DataLoader sharded over the ranks,
the batches drawn from it, and the tensors inside a batch."""
from __future__ import annotations

import contextlib
import signal
from collections.abc import Generator, Iterator
from typing import Any

import torch

from .distributed import Distributed
from .knobs import ConfigDict, Device


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


def move(obj: Any, device: torch.device, *, channels_last: bool = False) -> Any:
    """Move nested tensors to the device; 4-D float inputs go channels_last if asked."""
    if isinstance(obj, torch.Tensor):
        non_blocking = device.type == Device.CUDA
        if channels_last and obj.dim() == 4 and obj.is_floating_point():
            return obj.to(device, non_blocking=non_blocking, memory_format=torch.channels_last)
        return obj.to(device, non_blocking=non_blocking)
    if isinstance(obj, dict):
        return {k: move(v, device, channels_last=channels_last) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(move(v, device, channels_last=channels_last) for v in obj)
    return obj


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


def global_batch_size(cfg: ConfigDict, dist: Distributed) -> int:
    """The batch of one optimizer step over every rank: the tuned batch_size is one node's
    (its ``nprocs`` ranks), so each node of a larger job adds one, and every rank keeps the
    per-rank batch that was tuned. A stand-in for Distributed without ``nodes`` is one node."""
    return int(cfg["batch_size"]) * int(getattr(dist, "nodes", 1))


def build_loader(user: Any, cfg: ConfigDict, dist: Distributed, *, seed: int,
                 dataset: Any = None) -> tuple[Any, Any]:
    """The real DataLoader the user would train with, sharded over ranks; and its
    sampler, None for an IterableDataset (sharded by IterableShard instead). ``dataset``:
    the user's data set, built already; else it is built here."""
    if dataset is None:
        dataset = user.build_dataset()
    global_batch = global_batch_size(cfg, dist)
    sampler: GlobalBatchSampler | None = None
    if isinstance(dataset, torch.utils.data.IterableDataset):
        dataset = IterableShard(dataset, global_batch=global_batch, world=dist.world, rank=dist.rank)
        per_rank = dataset.per_rank
        items = length(dataset.dataset)  # None: a stream of unknown length
    else:
        sampler = GlobalBatchSampler(
            len(dataset), global_batch=global_batch, world=dist.world, rank=dist.rank, seed=seed
        )
        per_rank = sampler.per_rank
        items = len(dataset)
    if items is not None and items < global_batch:
        raise ValueError(f"the dataset has {items} items: too few for one batch of {global_batch}")
    workers = int(cfg.get("num_workers", 0))
    # The worker settings only where there are workers: DataLoader refuses them without.
    prefetch = cfg.get("prefetch_factor")
    loader = torch.utils.data.DataLoader(
        dataset,
        batch_size=per_rank,
        sampler=sampler,
        num_workers=workers,
        pin_memory=bool(cfg.get("pin_memory")) and dist.device.type == Device.CUDA,
        drop_last=True,  # a ragged last batch would recompile a compiled model
        collate_fn=getattr(user, "collate_fn", None),
        worker_init_fn=leave_stop_signals_to_the_trainer if workers > 0 else None,
        persistent_workers=workers > 0 and bool(cfg.get("persistent_workers")),
        prefetch_factor=int(prefetch) if workers > 0 and prefetch else None,
    )
    return loader, sampler


def batches(loader: Any, sampler: Any, *, start_epoch: int = 0) -> Generator[Any, None, None]:
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


def length(obj: Any) -> int | None:
    """len(obj), or None for an object without one (a stream)."""
    try:
        return len(obj)
    except TypeError:
        return None
