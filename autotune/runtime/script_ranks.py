"""A user's script run as several ranks: how its ranks meet, and what each one ran with.

Started by ``ranks.start_ranks`` (a trial's worker, or ``run_tuned.py`` from ``launch.sh`` on one
node), the ranks have RANK, WORLD_SIZE and LOCAL_RANK as torchrun gives them, but no
MASTER_ADDR: they meet through a file store (``TUNED_STORE``). ``join`` starts the process group
there before the user's script runs; their framework (the Trainer's accelerate, Lightning's DDP
strategy) finds it started and uses it, where left to itself it would start a TCP store on
rank 0, which listens on every interface. Under torchrun (several nodes, torchrun.sh) nothing is
joined here: the framework joins as it always does.

Stdlib at import (``run_tuned.py`` imports it before torch, as it does ``ranks``).
"""
from __future__ import annotations

import datetime
import os
from typing import Any

TIMEOUT = datetime.timedelta(minutes=60)  # as runtime.distributed's: a rank waits that long for the others


def started_here() -> bool:
    """Whether this process is one of several ranks that ``ranks.start_ranks`` started."""
    return bool(os.environ.get("TUNED_STORE")) and int(os.environ.get("WORLD_SIZE", "1")) > 1


def join(backend: str) -> None:
    """Start this rank's process group on the ranks' file store (``backend``: gloo, nccl), where
    ``started_here``; else nothing. On GPUs the rank's device is set first, as torchrun's
    ranks set it through LOCAL_RANK."""
    import torch

    if not started_here() or torch.distributed.is_initialized():
        return
    if backend == "nccl" and torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    torch.distributed.init_process_group(backend=backend, init_method=f"file://{os.environ['TUNED_STORE']}",
                                         rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]),
                                         timeout=TIMEOUT)


def every_rank(facts: dict[str, Any]) -> list[dict[str, Any]]:
    """``facts`` of this rank and of every other, in rank order (a collective: every rank calls
    it at the same point); ``[facts]`` in one process."""
    import torch

    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return [facts]
    out: list[Any] = [None] * dist.get_world_size()
    group = dist.new_group(backend="gloo") if dist.get_backend() != "gloo" else None  # objects go on the host
    dist.all_gather_object(out, facts, group=group)
    return out
