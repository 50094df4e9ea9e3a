"""This process's place in the job: rank, world size, device, and the collectives the
runtime's own decisions need."""
from __future__ import annotations

import datetime
import json
import os
import re
import sys
import time
from typing import Any

import torch

from . import nodes
from .knobs import Backend, ConfigDict, Device

DIST_TIMEOUT_MIN = 60.0
# What gloo and NCCL say when the other end of a rank's connection is gone: its process
# ended (its node's agent was killed, the node was lost) and the kernel closed its sockets.
PEER_LOST = ("Connection reset by peer", "Connection closed by peer", "Broken pipe",
             "Connection refused", "remote process exited")


class Distributed:
    """This process's place in the job: rank, world size, nodes, device.

    ``timeout_min`` bounds every collective: a rank waits that long for the others (in a
    barrier while rank 0 evaluates, say) before the job is torn down. NCCL's own default,
    10 minutes, is shorter than many a validation pass."""

    def __init__(self, cfg: ConfigDict, *, timeout_min: float = DIST_TIMEOUT_MIN) -> None:
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        # The configuration was tuned on one node: each node of a job runs its layout,
        # so the global batch is the tuned one times the nodes.
        self.nodes = nodes.count()
        self._host_group: Any = None
        if cfg.get("device") == Device.CUDA:
            self.device = torch.device(Device.CUDA.value, self._cuda_index())
            torch.cuda.set_device(self.device)
        else:
            self.device = torch.device(Device.CPU.value)
        self.enabled = self.world > 1
        if self.enabled:
            timeout = datetime.timedelta(minutes=timeout_min)
            backend = str(cfg.get("backend", Backend.GLOO))  # torch wants a plain str
            if backend == Backend.CCL:
                import oneccl_bindings_for_pytorch  # noqa: F401  (registers the backend; optional)
            store = os.environ.get("TUNED_STORE")
            if store:  # ranks started by ranks.start_ranks: a file store, nothing listening
                torch.distributed.init_process_group(backend=backend, init_method=f"file://{store}",
                                                     rank=self.rank, world_size=self.world,
                                                     timeout=timeout)
            else:  # under the user's own launcher (torchrun, a cluster job)
                torch.distributed.init_process_group(backend=backend, timeout=timeout)
            if backend == Backend.NCCL:
                # Agreement on host values (a stop request, a window's start) over gloo
                # on CPU tensors: through NCCL each one would wait for the GPU's queue
                # to drain (all-reduce on the device, then .item()). Every rank creates
                # it here, at the same point: new_group is collective.
                self._host_group = torch.distributed.new_group(backend=Backend.GLOO.value, timeout=timeout)

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

    @property
    def backend(self) -> str | None:
        """The process group's backend as torch reports it; None in one process."""
        return torch.distributed.get_backend() if self.enabled else None

    def agree_max(self, value: float) -> float:
        """The largest of the ranks' values, so every rank takes the same decision. On the
        host: the value is a host value, and no GPU work has to finish for it."""
        if not self.enabled:
            return value
        t = torch.tensor([value], dtype=torch.float64)
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX, group=self._host_group)
        return float(t.item())

    def mean(self, value: torch.Tensor) -> torch.Tensor:
        """The ranks' mean of a scalar tensor (a loss), on its device; itself in one process."""
        if not self.enabled:
            return value
        total = value.float().clone()
        torch.distributed.all_reduce(total)
        return total / self.world

    def barrier(self) -> None:
        """Every rank gets here before any goes on; on the host, as agree_max."""
        if self.enabled:
            torch.distributed.barrier(group=self._host_group)

    def synchronize(self) -> None:
        if self.device.type == Device.CUDA:
            torch.cuda.synchronize(self.device)

    def close(self) -> None:
        if self.enabled and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def lost_peer(error: BaseException) -> bool:
    """Whether a collective failed because another rank of the job is gone: a backend's
    error (NCCL's are DistError, gloo's plain RuntimeErrors from its transport) saying so;
    a broken pipe elsewhere (a DataLoader worker's) is not one."""
    text = str(error)
    collective = isinstance(error, torch.distributed.DistError) or "gloo" in text
    return collective and any(marker in text for marker in PEER_LOST)


def report_lost_peer(rank: int, error: BaseException) -> str:
    """Say in one line, on stderr, that this rank lost another (the collective's own
    message, a traceback deep in backward(), names neither); under torchrun also in the
    error file its agent reads, so the agent's failure summary shows that line rather than
    a pointer to its documentation. Returns the line."""
    detail = next((line.strip() for line in str(error).splitlines() if line.strip()), type(error).__name__)
    # gloo's "[/path/pair.cc:537] Read error [addr]:port: Connection reset by peer. This is
    # typically caused by ...": the source location and the advice say nothing here
    detail = re.sub(r"^\[[^\]]*\]\s*", "", detail).split(". ")[0]
    line = (f"error: rank {rank} lost another rank of the job, which ends here: a rank or a whole node "
            f"ended (the other nodes' output says why) or the network between them failed ({detail[:300]})")
    print(line, file=sys.stderr, flush=True)
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if path:
        # torchrun's reply-file format (torch.distributed.elastic.multiprocessing.errors)
        data = {"message": {"message": line, "extraInfo": {"py_callstack": line,
                                                            "timestamp": str(int(time.time()))}}}
        try:
            with open(path, "w") as f:
                json.dump(data, f)
        except OSError:
            pass
    return line
