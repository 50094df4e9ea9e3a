"""A small plain loop that evaluates and prints its validation accuracy after every epoch (8
steps), then saves its model to --save: what a gate's scored training reads, and stops at."""
import argparse

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--save", default=None)
    args = parser.parse_args()
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(128, 8), torch.randint(0, 2, (128,)))
    val_x, val_y = torch.randn(64, 8), torch.randint(0, 2, (64,))
    loader = DataLoader(data, batch_size=args.batch_size, shuffle=True)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(args.epochs):
        for x, y in loader:
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        with torch.no_grad():
            acc = (model(val_x).argmax(1) == val_y).float().mean().item()
        print(f"epoch {epoch} val_acc {acc:.6f}", flush=True)
    if args.save:
        torch.save(model.state_dict(), args.save)


if __name__ == "__main__":
    main()
