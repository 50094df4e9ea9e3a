"""This process's place in the job: rank, world size, device, and the collectives the
runtime's own decisions need."""
from __future__ import annotations

import datetime
import os
from typing import Any

import torch

from .knobs import Backend, ConfigDict

DIST_TIMEOUT_MIN = 60.0


class Distributed:
    """This process's place in the job: rank, world size, device.

    ``timeout_min`` bounds every collective: a rank waits that long for the others (in a
    barrier while rank 0 evaluates, say) before the job is torn down. NCCL's own default,
    10 minutes, is shorter than many a validation pass."""

    def __init__(self, cfg: ConfigDict, *, timeout_min: float = DIST_TIMEOUT_MIN) -> None:
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
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def close(self) -> None:
        if self.enabled and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
