"""Whether verification's next standalone runs set up while one trains (verify/overlap.py),
and what the pairs then cost (verify/deadline.Costs.pairs): read from recorded machines."""
from __future__ import annotations

import pytest

from autotune.config import TrialConfig
from autotune.probes import as_machine
from autotune.verify.deadline import Costs
from autotune.verify.device_room import DeviceRoom
from autotune.verify.overlap import MOST_AHEAD, ahead

from doubles import recorded_machine

GPU = TrialConfig(device="cuda", backend="nccl", batch_size=64, num_workers=4)
BASE = TrialConfig(device="cuda", backend="nccl", batch_size=64)


def room(name: str, peak_mb: float) -> DeviceRoom:
    return DeviceRoom.of(as_machine(recorded_machine(name)), [(GPU, peak_mb), (BASE, peak_mb)])


def cores(name: str) -> int:
    return as_machine(recorded_machine(name)).cpu.usable_cores


def test_a_gpu_node_with_cores_and_memory_to_spare_sets_runs_up_ahead():
    n, why = ahead(cores=cores("h100x1"), room=room("h100x1", 700.0), configs=[BASE, GPU])
    assert n == MOST_AHEAD and why is None


@pytest.mark.parametrize(("cores_", "peak_mb", "configs", "said"), [
    (2, 700.0, [BASE, GPU], "cores"),  # a 2-core machine: the measuring run and its 4 workers take them
    (32, 50_000.0, [BASE, GPU], "MiB"),  # two processes of a model that fills an H100 do not fit on it
    (32, 700.0, [BASE, GPU.replace(nprocs=8)], None),  # 8 ranks x (1 + 4 workers) = 40 of 32 cores
    (32, 700.0, [TrialConfig(batch_size=64), TrialConfig(batch_size=128)], "CPU"),  # every core measures
])
def test_no_run_sets_up_ahead_where_cores_or_gpu_memory_would_be_shared(cores_, peak_mb, configs, said):
    machine = "h100x8" if any(c.nprocs == 8 for c in configs) else "h100x1"
    n, why = ahead(cores=cores_, room=room(machine, peak_mb), configs=configs)
    assert n == 0 and why
    if said:
        assert said in why, why


@pytest.mark.parametrize("name", ["h100x8_mig", "h100x8_exclusive"])
def test_mig_slices_and_exclusive_gpus_set_no_run_up_ahead(name):
    n, why = ahead(cores=64, room=room(name, 700.0), configs=[BASE, GPU])
    assert n == 0 and ("MIG" in why or "exclusive" in why), why


def test_runs_set_up_ahead_cost_one_setup_then_each_runs_training_or_its_share_of_a_setup():
    costs = Costs(start_s=10.0, window_s=1.0, sample_s=0.0, setup_s=8.0)
    assert costs.pairs(3, 8.0) == 3 * 2 * (10.0 + 8.0)
    # a run's warm-up and training (2 + 8 s) outlast a setup (8 s): one setup, then 10 s a run
    assert costs.pairs(3, 8.0, ahead=1) == 8.0 + 6 * 10.0
    # 3 s runs: a setup is 8 s, one ahead waits 8 s a run, two ahead 4 s (5 s of training)
    assert costs.pairs(3, 3.0, ahead=1) == 8.0 + 6 * 8.0
    assert costs.pairs(3, 3.0, ahead=2) == 8.0 + 6 * 5.0
