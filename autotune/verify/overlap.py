"""Whether the next standalone run may set up while the current one measures.

A fresh run of a script spends its first seconds (several on a GPU node) on the
interpreter, the imports, ``build_dataset``, ``build_model`` and the CUDA context before
its first step, and verification's pairs are a dozen such runs. Where the machine has
cores and GPU memory to spare, the next run does all that beside the one that measures,
and trains only once that one has ended (``standalone.alternate``): no timed step ever
shares the GPUs or the measuring run's cores.
"""
from __future__ import annotations

from collections.abc import Sequence

from autotune.config import TrialConfig
from autotune.runtime.knobs import Device
from autotune.verify.device_room import DeviceRoom

# Runs setting up at once beside the one that measures, at most: two cover a setup twice as
# long as a run's training; more would only hold GPU and host memory while they wait.
MOST_AHEAD = 2


def ahead(*, cores: int | None, room: DeviceRoom | None, configs: Sequence[TrialConfig]) -> tuple[int, str | None]:
    """How many standalone runs may set up while another measures (0: none), and why not
    more. A run sets up (interpreter, imports, build_dataset, build_model, the CUDA context)
    on one core a rank and on its GPUs' memory, and trains only once it is let go: those
    setting up must neither take a core the measuring run and its DataLoader workers use,
    nor take GPU memory the GPUs cannot hold beside it. On a CPU every core measures: never
    there."""
    if any(cfg.device != Device.CUDA for cfg in configs):
        return 0, "the runs measure on the CPU: a run setting up beside one would take its cores"
    busiest = max(cfg.nprocs * (1 + cfg.num_workers) for cfg in configs)
    starting = max(cfg.nprocs for cfg in configs)
    by_cores = ((cores or 0) - busiest - 1) // starting
    if by_cores < 1:
        return 0, (f"{cores or 0} cores: the measuring run and its DataLoader workers take {busiest}, "
                   f"a run setting up {starting} more")
    if room is None or room.capacity_mb is None or room.fresh is not None:
        return 0, room.fresh if room is not None and room.fresh else "the GPUs' memory is not known"
    needs = [room.need_mb(cfg) for cfg in configs]
    if any(n is None for n in needs):
        return 0, "a configuration's GPU memory was not measured"
    # the pairs alternate, so a configuration's run may set up beside its own; a run setting
    # up holds less than its peak, which counts it high
    largest = max(float(n) for n in needs if n is not None)
    by_memory = int(room.capacity_mb // largest) - 1
    if by_memory < 1:
        return 0, (f"two runs need {2 * largest:,.0f} MiB of a GPU's {room.capacity_mb:,.0f} MiB "
                   "(its share that processes may hold together)")
    return min(MOST_AHEAD, by_cores, by_memory), None
