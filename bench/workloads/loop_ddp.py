"""A plain training loop written for DDP, as torchrun runs it: it joins a process group where
its environment gives it a rank, shards the data with a DistributedSampler, wraps its MLP in
DistributedDataParallel, and prints from rank 0 the validation accuracy its ranks summed after
every epoch, then its training rate (samples per second after its first 5 steps, all ranks'
samples). ``--batch-size`` is each rank's.

    python bench/workloads/loop_ddp.py --epochs 2
    OMP_NUM_THREADS=1 torchrun --nproc-per-node 2 bench/workloads/loop_ddp.py --epochs 2 --batch-size 32
"""
import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

FEATURES, CLASSES, WARM = 128, 10, 5


def teacher_data(n: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, FEATURES, generator=g)
    teacher = torch.randn(FEATURES, CLASSES, generator=torch.Generator().manual_seed(1234))
    return TensorDataset(x, (torch.tanh(x) @ teacher).argmax(dim=1))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--lr", type=float, default=0.05)
    args = parser.parse_args()
    ddp = "RANK" in os.environ
    if ddp:
        dist.init_process_group(backend="gloo")
    rank, world = (dist.get_rank(), dist.get_world_size()) if ddp else (0, 1)
    torch.manual_seed(0)
    train, val = teacher_data(16384, 0), teacher_data(2048, 1)
    sampler = DistributedSampler(train, shuffle=True) if ddp else None
    loader = DataLoader(train, batch_size=args.batch_size, shuffle=sampler is None, sampler=sampler)
    model: nn.Module = nn.Sequential(nn.Linear(FEATURES, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                                     nn.Linear(512, CLASSES))
    if ddp:
        model = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    steps, samples, start = 0, 0, None
    for epoch in range(args.epochs):
        if sampler is not None:
            sampler.set_epoch(epoch)
        model.train()
        for x, y in loader:
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            steps += 1
            if steps == WARM:
                start = time.perf_counter()
            elif start is not None:
                samples += len(x) * world
        model.eval()
        with torch.no_grad():
            x, y = val.tensors
            correct = (model(x).argmax(1) == y).sum()
        if ddp:  # every rank judged the whole set: their mean
            dist.all_reduce(correct)
            correct = correct / world
        if rank == 0:
            print(f"epoch {epoch} val_acc {correct.item() / len(y):.4f}", flush=True)
    if rank == 0 and start is not None:
        print(f"{samples / (time.perf_counter() - start):.1f} samples/s", flush=True)
    if ddp:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
