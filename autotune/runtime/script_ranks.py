"""A user's script run as several ranks: how its ranks meet, and what each one ran with.

Started by ``ranks.start_ranks`` (a trial's worker, or ``run_tuned.py`` from ``launch.sh`` on one
node), the ranks have RANK, WORLD_SIZE and LOCAL_RANK as torchrun gives them, but no
MASTER_ADDR: they meet through a file store (``TUNED_STORE``). ``join`` starts the process group
there before the user's script runs; their framework (the Trainer's accelerate, Lightning's DDP
strategy) finds it started and uses it, where left to itself it would start a TCP store on
rank 0, which listens on every interface. A plain loop written for DDP joins its group itself:
``join_own_group`` has its ``init_process_group`` meet the ranks there. Under torchrun (several
nodes, torchrun.sh) nothing is joined here: the framework joins as it always does.

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


def meeting() -> dict[str, Any]:
    """Where ranks that ``started_here`` meet, as ``init_process_group``'s arguments: their file store,
    this rank and their number."""
    return {"init_method": f"file://{os.environ['TUNED_STORE']}", "rank": int(os.environ["RANK"]),
            "world_size": int(os.environ["WORLD_SIZE"])}


def join(backend: str) -> None:
    """Start this rank's process group on the ranks' file store (``backend``: gloo, nccl), where
    ``started_here``; else nothing. On GPUs the rank's device is set first, as torchrun's
    ranks set it through LOCAL_RANK."""
    import torch

    if not started_here() or torch.distributed.is_initialized():
        return
    if backend == "nccl" and torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    torch.distributed.init_process_group(backend=backend, timeout=TIMEOUT, **meeting())


def join_own_group() -> None:
    """From now on the script's own ``init_process_group`` (env://, as torchrun's ranks call
    it) joins where this process's ranks meet:

    - a trial's ranks, whose group autotune started before the script ran: the call returns,
      the group is the one it joins, and its ``destroy_process_group`` leaves it to autotune;
    - ranks started over loopback (``started_here``: launch.sh): their file store,
      with the script's backend and timeout;
    - one process with no rank in its environment (a script that always joins a group): a group
      of one on a file store of its own, as ``torchrun --nproc-per-node 1`` would give it;
    - under torchrun (MASTER_ADDR set: several nodes), or a store of the script's own: as called.
    """
    import tempfile

    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    init, destroy = c10d.init_process_group, c10d.destroy_process_group
    if getattr(init, "_joins_own_group", False):
        return  # installed already
    autotunes = dist.is_available() and dist.is_initialized()

    def init_process_group(backend: Any = None, init_method: Any = None, *args: Any, **kwargs: Any) -> Any:
        if dist.is_initialized():
            return None
        env = init_method in (None, "env://") and kwargs.get("store") is None and not args
        if env and "MASTER_ADDR" not in os.environ:
            if started_here():
                return init(backend, **kwargs, **meeting())
            if "RANK" not in os.environ:
                alone = os.path.join(tempfile.mkdtemp(prefix="tuned-group-"), "store")
                return init(backend, **kwargs, init_method=f"file://{alone}", rank=0, world_size=1)
        return init(backend, init_method, *args, **kwargs)

    def destroy_process_group(*args: Any, **kwargs: Any) -> Any:
        if autotunes and not args and not kwargs.get("group"):
            return None
        return destroy(*args, **kwargs)

    init_process_group._joins_own_group = True  # type: ignore[attr-defined]
    for module in (dist, c10d):
        setattr(module, "init_process_group", init_process_group)  # noqa: B010  (untyped on one of them)
        setattr(module, "destroy_process_group", destroy_process_group)  # noqa: B010


def every_rank(facts: dict[str, Any]) -> list[dict[str, Any]]:
    """``facts`` of this rank and of every other, in rank order (a collective: every rank calls
    it at the same point); ``[facts]`` in one process."""
    import torch

    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return [facts]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, facts, group=_host_group())
    return out


_HOST: list[Any] = []  # the gloo group objects go through where the ranks' own backend is not gloo


def _host_group() -> Any:
    """A gloo group of every rank, made once (``new_group`` is a collective, and each one made
    holds its connections for the life of the process), where the default group's backend is
    not gloo: objects go on the host. None where it is gloo: the default group."""
    import torch

    dist = torch.distributed
    if dist.get_backend() == "gloo":
        return None
    if not _HOST:
        _HOST.append(dist.new_group(backend="gloo"))
    return _HOST[0]
