"""An IterableDataset is accepted as it is: autotune shards the stream over ranks and
DataLoader workers itself, so every layout and worker count trains on the global batches
of one process, in the same order (what the numerics check compares)."""
from __future__ import annotations

import json
import signal
import subprocess
import types
from pathlib import Path

import pytest
import torch
from torch.utils.data._utils import worker as worker_state

from autotune.config import TrialConfig
from autotune.errors import ContractError
from autotune.runtime.data import IterableShard, build_loader
from autotune.runtime.session import Session, load_user_module
from autotune.task import load_task

from helpers import MODELS, emit_outputs, interrupt_after, run_launch_sh, start_launch_sh

STREAM = MODELS / "token_stream.py"


class Numbers(torch.utils.data.IterableDataset):
    """0, 1, ..., n-1: a stream that does not shard itself."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        return iter(range(self.n))


def slot_items(dataset, *, global_batch: int, world: int, rank: int, workers: int, worker: int,
               monkeypatch) -> list[int]:
    """What one (rank, worker) slot yields, run in this process as that worker."""
    shard = IterableShard(dataset, global_batch=global_batch, world=world, rank=rank)
    info = torch.utils.data._utils.worker.WorkerInfo(id=worker, num_workers=workers, seed=0, dataset=shard)
    monkeypatch.setattr(worker_state, "_worker_info", info)
    return list(shard)


def test_two_ranks_of_two_workers_read_disjoint_shares_of_every_full_global_batch(monkeypatch):
    # 100 items in global batches of 8: 12 full ones; the 4 left over go on no rank, or
    # one rank would make a step the other never joins.
    slots = {(rank, worker): slot_items(Numbers(100), global_batch=8, world=2, rank=rank, workers=2,
                                        worker=worker, monkeypatch=monkeypatch)
             for rank in range(2) for worker in range(2)}
    everything = sorted(i for items in slots.values() for i in items)
    assert everything == list(range(96)), "each item once, the partial last batch on no rank"
    assert all(len(items) % 4 == 0 for items in slots.values()), "whole per-rank batches only"
    assert len(slots[0, 0]) + len(slots[0, 1]) == len(slots[1, 0]) + len(slots[1, 1]) == 48
    # rank r holds the r-th half of each global batch; worker w every w-th of its batches
    assert slots[0, 0][:8] == [0, 1, 2, 3, 16, 17, 18, 19]
    assert slots[1, 1][:8] == [12, 13, 14, 15, 28, 29, 30, 31]


def test_a_stream_shorter_than_a_global_batch_is_an_error_not_an_empty_epoch(monkeypatch):
    with pytest.raises(ValueError, match="yielded 5 items: too few for one batch of 8"):
        slot_items(Numbers(5), global_batch=8, world=1, rank=0, workers=1, worker=0,
                   monkeypatch=monkeypatch)


def batches_of(path: Path, *, world: int, workers: int, batch_size: int = 8,
               epochs: int = 1, persistent: bool = False) -> list[list[int]]:
    """Each global batch, as item indices, that ``world`` ranks train on, in order."""
    user = load_user_module(str(path))
    per_rank = []
    for rank in range(world):
        dist = types.SimpleNamespace(world=world, rank=rank, device=torch.device("cpu"))
        cfg = {"batch_size": batch_size, "num_workers": workers, "persistent_workers": persistent}
        loader, sampler = build_loader(user, cfg, dist, seed=0)
        assert sampler is None
        drawn = []
        for epoch in range(epochs):
            loader.dataset.set_epoch(epoch)
            drawn += [inputs[:, 0].long().tolist() for inputs, _ in loader]
        per_rank.append(drawn)
    assert len({len(batches) for batches in per_rank}) == 1, "every rank makes as many steps"
    return [sum(parts, []) for parts in zip(*per_rank)]


@pytest.mark.slow
def test_with_real_workers_every_layout_trains_on_the_batches_of_one_process():
    # The stream splits itself among workers (as PyTorch's docs show): autotune must
    # hand each slot the whole stream anyway, or items would go missing.
    one = batches_of(STREAM, world=1, workers=0, epochs=2)
    assert len(one) == 64
    assert sorted(sum(one[:32], [])) == sorted(sum(one[32:], [])) == list(range(256))
    assert one[:32] != one[32:], "set_epoch reached the stream: epoch 1 has another order"
    assert batches_of(STREAM, world=2, workers=2, epochs=2) == one
    assert batches_of(STREAM, world=1, workers=2, epochs=2, persistent=True) == one


@pytest.mark.slow
def test_a_model_file_with_a_stream_passes_the_contract_check():
    task = load_task(STREAM)
    # 256 items run past the 16 batches the check reads: a stream of unknown length
    assert task.dataset_len is None
    assert task.batch_size == 8 and not task.image_inputs


def stream_of(tmp_path: Path, items: int, extra: str = "") -> Path:
    path = tmp_path / f"stream_{items}.py"
    path.write_text(STREAM.read_text().replace("ITEMS = 256", f"ITEMS = {items}") + extra)
    return path


@pytest.mark.slow
def test_the_check_counts_a_short_stream_and_rejects_one_shorter_than_a_batch(tmp_path):
    assert load_task(stream_of(tmp_path, 100)).dataset_len == 100  # caps the batch sizes tried
    with pytest.raises(ContractError, match="5 items, fewer than batch_size = 8"):
        load_task(stream_of(tmp_path, 5))


@pytest.mark.slow
def test_a_stream_with_a_length_reports_it(tmp_path):
    sized = stream_of(tmp_path, 300, "\n\nStream.__len__ = lambda self: self.n\n")
    assert load_task(sized).dataset_len == 300


def session_losses(path: Path, steps: int, **cfg) -> list[float]:
    session = Session(str(path), {"batch_size": 8, "threads": 1, **cfg})
    try:
        return session.run_steps(steps)[1]
    finally:
        session.close()


@pytest.mark.slow
def test_a_session_trains_on_a_stream_alike_with_and_without_workers():
    # 40 steps cross into the second epoch (32 batches each)
    alone = session_losses(STREAM, 40)
    assert sum(alone[-5:]) < sum(alone[:5]), alone
    assert session_losses(STREAM, 40, num_workers=2) == pytest.approx(alone, rel=1e-6)
    assert session_losses(STREAM, 40, num_workers=2, persistent_workers=True) == pytest.approx(alone, rel=1e-6)


def test_a_batch_larger_than_the_stream_fails_the_session_clearly(tmp_path):
    with pytest.raises(ValueError, match="yielded 40 items: too few for one batch of 64"):
        Session(str(stream_of(tmp_path, 40)), {"batch_size": 64})


@pytest.mark.slow
def test_a_resumed_session_on_a_stream_draws_the_batches_an_uninterrupted_one_would():
    # train_tuned.py --resume starts a Session at the checkpoint's step: a stream has no
    # sampler to skip with, so it is read through to that step, across the epoch's end.
    def inputs(session, n):
        return [session.next_batch()[0][:, 0].long().tolist() for _ in range(n)]

    whole = Session(str(STREAM), {"batch_size": 8, "num_workers": 2})
    resumed = Session(str(STREAM), {"batch_size": 8, "num_workers": 2}, start_step=30)
    try:
        assert inputs(whole, 36)[30:] == inputs(resumed, 6)
    finally:
        whole.close()
        resumed.close()


@pytest.mark.slow
def test_the_emitted_script_trains_a_stream_on_two_ranks_with_workers_and_resumes_it(
        tmp_path, no_autotune_env):
    out, work = tmp_path / "out", tmp_path / "work"
    emit_outputs(out, TrialConfig(nprocs=2, threads=1, batch_size=16, num_workers=2), STREAM)
    no_steps = subprocess.run(["bash", str(out / "launch.sh")], cwd=tmp_path, env=no_autotune_env,
                              capture_output=True, text=True, timeout=120)
    assert no_steps.returncode == 2 and "the dataset has no length: give --max-steps" in no_steps.stderr
    run_launch_sh(out, tmp_path / "whole", no_autotune_env, "--max-steps", "30", "--log-every", "1",
                  "--no-checkpoint", "--report", "r.json")
    expected = json.loads((tmp_path / "whole" / "r.json").read_text())["losses"]

    proc = start_launch_sh(out, work, no_autotune_env, "--max-steps", "30", "--log-every", "1", "--report", "a.json")
    stdout, stderr = interrupt_after(proc, "step 3/30", signal.SIGTERM)
    assert proc.returncode == 128 + signal.SIGTERM, stdout + stderr
    stopped_at = json.loads((work / "a.json").read_text())["steps"]
    assert stopped_at in (10, 20)  # the ranks agree on stopping every 10 steps
    # no sampler to skip with: the resumed run reads the stream through to where it stopped
    run_launch_sh(out, work, no_autotune_env, "--resume", "--max-steps", "30", "--log-every", "1",
                  "--report", "b.json")
    resumed = json.loads((work / "b.json").read_text())["losses"]
    assert resumed == pytest.approx(expected[stopped_at:], rel=1e-6)
