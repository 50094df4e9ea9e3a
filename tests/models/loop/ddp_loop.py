"""A small plain loop written for DDP as torchrun runs it: it joins a process group where the
environment gives it a rank, shards the data with a DistributedSampler, wraps its model in
DistributedDataParallel, sums its ranks' validation counts and prints the accuracy from rank 0
after every epoch (8 steps at 16 a rank in one process), then leaves the group. ``--batch-size``
is each rank's; ``--eval-seconds`` makes rank 0's evaluation that slow (the other ranks' scripts
end before rank 0 prints its last accuracy); ``--always-join`` joins a group as one process too
(a script written for torchrun alone)."""
import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--eval-seconds", type=float, default=0.0)
    parser.add_argument("--always-join", action="store_true", help="join a group even as one process")
    args = parser.parse_args()
    ddp = "RANK" in os.environ or args.always_join
    if ddp:
        dist.init_process_group(backend="gloo")
    rank = dist.get_rank() if ddp else 0
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(128, 8), torch.randint(0, 2, (128,)))
    val_x, val_y = torch.randn(64, 8), torch.randint(0, 2, (64,))
    sampler = DistributedSampler(data, shuffle=True) if ddp else None
    loader = DataLoader(data, batch_size=args.batch_size, shuffle=sampler is None, sampler=sampler)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    if ddp:
        model = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(args.epochs):
        if sampler is not None:
            sampler.set_epoch(epoch)
        for x, y in loader:
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        with torch.no_grad():
            correct = (model(val_x).argmax(1) == val_y).sum()
        if ddp:  # each rank judged the same set: their sum over ranks, divided by as many
            dist.all_reduce(correct)
            correct = correct / dist.get_world_size()
        if rank == 0:
            time.sleep(args.eval_seconds)
            print(f"epoch {epoch} val_acc {correct.item() / len(val_y):.6f}", flush=True)
    if ddp:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
