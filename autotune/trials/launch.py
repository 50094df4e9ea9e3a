"""How a configuration is launched: its process command and its environment.

One place for both, used by the trials and by the emitted ``launch.sh`` (``autotune.emit``
renders it as shell lines, ``autotune.emit.shell``), so the script is started exactly as
the trial was measured.
"""
from __future__ import annotations

import os
from collections.abc import Mapping

from autotune.config import TrialConfig
from autotune.probes import MachineLike, as_machine
from autotune.runtime import gpu_knobs
from autotune.runtime.knobs import Affinity, Allocator, CompileMode, Device

JEMALLOC_CONF = "oversize_threshold:1,background_thread:true,metadata_thp:auto"

# autotune's own protocol between a launcher and runtime.ranks.start_ranks: a value inherited
# from whoever started autotune (a launch.sh, a trial) describes another configuration,
# so it is never kept, whatever the "keep the user's value" rule says for the others.
PROTOCOL_VARIABLES = ("TUNED_NPROCS", "TUNED_CPUS_PER_RANK", "TUNED_STORE")


def rank_cpus(cfg: TrialConfig, usable_cpus: list[int]) -> list[list[int]]:
    """Disjoint, compact core sets, one per rank: rank r gets the r-th block of the
    usable cores (listed node by node, so a block stays NUMA-local where it can)."""
    per_rank = cfg.threads or max(1, len(usable_cpus) // cfg.nprocs)
    blocks = [usable_cpus[r * per_rank : (r + 1) * per_rank] for r in range(cfg.nprocs)]
    if any(not b for b in blocks):
        raise ValueError(
            f"{cfg.nprocs} ranks x {per_rank} cores do not fit in {len(usable_cpus)} usable cores"
        )
    return blocks


def environment(
    cfg: TrialConfig, *, machine: MachineLike, base_env: Mapping[str, str] | None = None
) -> tuple[dict[str, str], list[str]]:
    """Variables this configuration sets, and a warning for each one the user had
    already set: theirs is kept, never overridden silently (autotune's own
    PROTOCOL_VARIABLES excepted: those are always this configuration's; the CUDA
    allocator's options are merged, expandable segments added to the user's)."""
    machine = as_machine(machine)
    base_env = os.environ if base_env is None else base_env
    wanted: dict[str, str] = {}
    if cfg.threads is not None:
        wanted["OMP_NUM_THREADS"] = str(cfg.threads)
    if cfg.device == Device.CUDA:
        # CUDA's default order is fastest first; PCI order is NVML's and nvidia-smi's, so
        # a device index means the same GPU to CUDA_VISIBLE_DEVICES, the probe and the user.
        wanted["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    if cfg.nprocs > 1:
        # The script starts its own ranks (runtime.ranks.start_ranks), which talk over loopback.
        wanted["TUNED_NPROCS"] = str(cfg.nprocs)
        lo = loopback_interface()
        wanted["GLOO_SOCKET_IFNAME"] = lo
        if cfg.device == Device.CUDA:
            wanted["NCCL_SOCKET_IFNAME"] = lo
            if cfg.compile != CompileMode.OFF:
                # Each rank's inductor starts its own pool of compile workers, sized for
                # the whole machine; several ranks would oversubscribe the cores.
                cores = int(machine.cpu.usable_cores or 1)
                wanted["TORCHINDUCTOR_COMPILE_THREADS"] = str(max(1, cores // cfg.nprocs))
    if cfg.allocator != Allocator.DEFAULT:
        path = machine.allocators.get(cfg.allocator)
        if not path:
            raise ValueError(f"allocator {cfg.allocator} was not found on this machine")
        wanted["LD_PRELOAD"] = path
        if cfg.allocator == Allocator.JEMALLOC:
            wanted["MALLOC_CONF"] = JEMALLOC_CONF
    if cfg.affinity == Affinity.COMPACT and cfg.device == Device.CPU:
        cpus = machine.cpu.usable_cpus or sorted(os.sched_getaffinity(0))
        wanted["TUNED_CPUS_PER_RANK"] = ";".join(
            ",".join(map(str, block)) for block in rank_cpus(cfg, list(cpus))
        )
        # Threads stay on their rank's cores, one per core.
        wanted["OMP_PROC_BIND"] = "close"
        wanted["OMP_PLACES"] = "cores"
    chosen, warnings = {}, []
    for key, value in wanted.items():
        if key in base_env and base_env[key] != value and key not in PROTOCOL_VARIABLES:
            warnings.append(
                f"{key} is set to {base_env[key]!r} in your environment; autotune would set "
                f"{value!r} for this configuration and keeps yours instead"
            )
            continue
        chosen[key] = value
    if cfg.expandable_segments:
        # the user's allocator options are kept and ours added to them, not dropped
        chosen[gpu_knobs.ALLOC_CONF], warning = gpu_knobs.merged_alloc_conf(base_env.get(gpu_knobs.ALLOC_CONF))
        warnings += [warning] if warning else []
    return chosen, warnings


# What a launcher (torchrun, a Kubernetes PyTorchJob, an sbatch script) exports to place a
# process in a rank group. Inherited by a trial, they would make a one-process baseline
# join the user's real job (or hang waiting for it) and confuse the ranks autotune starts.
DISTRIBUTED_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                         "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME",
                         "NODE_RANK", "MASTER_ADDR", "MASTER_PORT")


def inherited_distributed(env: Mapping[str, str]) -> list[str]:
    """The rank-group variables in ``env``, sorted."""
    return sorted(k for k in env if k in DISTRIBUTED_VARIABLES or k.startswith("TORCHELASTIC_"))


def without_distributed(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` less the rank-group variables and autotune's protocol variables: trials
    start their own rank groups, and a configuration sets its own TUNED_* (a one-process
    configuration none)."""
    drop = set(inherited_distributed(env)) | set(PROTOCOL_VARIABLES)
    return {k: v for k, v in env.items() if k not in drop}


def loopback_interface() -> str:
    """The name of the interface that holds 127.0.0.1 ("lo" on Linux)."""
    import psutil

    for name, addresses in psutil.net_if_addrs().items():
        if any(a.address == "127.0.0.1" for a in addresses):
            return name
    return "lo"


def command(cfg: TrialConfig, entry: list[str], *, python: str) -> list[str]:
    """The process command: plain python, for one process or several (with
    TUNED_NPROCS in the environment it starts the ranks itself)."""
    return [python, *entry]
