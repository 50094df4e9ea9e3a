"""A plain PyTorch training loop, written as a user would write it: argparse, a DataLoader,
a small conv net, AdamW and ``for epoch ...: for x, y in train_loader: ...``. Nothing in it
knows about autotune; it is the example that

    autotune run examples/loop_mlp.py -- --epochs 3

tunes. The data are synthetic and built in code (no download): 3x16x16 "images" labelled
by a fixed random teacher network, so validation accuracy climbs well above chance (0.10)
within a few epochs. It prints its own training throughput each epoch and saves nothing.
"""
import argparse
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

NUM_CLASSES = 10
WARMUP_STEPS = 5  # steps at the start of each epoch left out of the throughput


def make_data(n_train=12000, n_val=2000, seed=1234):
    """Random images labelled by a fixed random teacher: a smooth, learnable function of the pixels."""
    g = torch.Generator().manual_seed(seed)
    images = torch.randn(n_train + n_val, 3, 16, 16, generator=g)
    features = F.avg_pool2d(images, 4).flatten(1)  # 3x4x4 = 48 coarse features per image
    w1 = torch.randn(48, 64, generator=g) / 48 ** 0.5
    w2 = torch.randn(64, NUM_CLASSES, generator=g) / 64 ** 0.5
    logits = torch.tanh(features @ w1) @ w2
    labels = (logits - logits.mean(0)).argmax(1)  # centring keeps the classes roughly balanced
    train = TensorDataset(images[:n_train], labels[:n_train])
    val = TensorDataset(images[n_train:], labels[n_train:])
    return train, val


class ConvNet(nn.Module):
    def __init__(self, num_classes=NUM_CLASSES):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 32, 3, padding=1)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.conv3 = nn.Conv2d(64, 128, 3, padding=1)
        self.fc1 = nn.Linear(128 * 4 * 4, 128)
        self.fc2 = nn.Linear(128, num_classes)

    def forward(self, x):
        x = F.relu(self.conv1(x))                   # 32x16x16
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)  # 64x8x8
        x = F.max_pool2d(F.relu(self.conv3(x)), 2)  # 128x4x4
        x = F.relu(self.fc1(x.flatten(1)))
        return self.fc2(x)


@torch.no_grad()
def evaluate(model, loader):
    model.eval()
    correct = total = 0
    for x, y in loader:
        correct += (model(x).argmax(1) == y).sum().item()
        total += len(y)
    model.train()
    return correct / total


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--workers", type=int, default=0, help="DataLoader num_workers")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    train_set, val_set = make_data()
    train_loader = DataLoader(train_set, batch_size=args.batch_size, shuffle=True, num_workers=args.workers)
    val_loader = DataLoader(val_set, batch_size=256, shuffle=False, num_workers=args.workers)

    model = ConvNet()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)

    for epoch in range(args.epochs):
        samples, start = 0, None
        for step, (x, y) in enumerate(train_loader):
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if step == WARMUP_STEPS - 1:  # the clock starts once the first 5 steps are done
                start = time.perf_counter()
            elif start is not None:
                samples += len(y)
        elapsed = time.perf_counter() - start if start is not None else 0.0
        rate = samples / elapsed if elapsed > 0 else float("nan")
        print(f"epoch {epoch}: train samples/s {rate:.1f}", flush=True)
        acc = evaluate(model, val_loader)
        print(f"val_acc {acc:.4f}", flush=True)


if __name__ == "__main__":
    main()
