"""A loop that accumulates gradients over micro-batches and reads its batch from --bs; its
model is built inside main() and its optimizer steps every --accumulate micro-batches."""
import argparse

import torch
import torch.nn.functional as F


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bs", type=int, default=8)
    parser.add_argument("--accumulate", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10_000)
    args = parser.parse_args()
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    for _ in range(args.steps):
        for _micro in range(args.accumulate):
            x, y = torch.randn(args.bs, 32), torch.randint(0, 4, (args.bs,))
            loss = F.cross_entropy(net(x), y) / args.accumulate
            loss.backward()
        opt.step()
        opt.zero_grad()


if __name__ == "__main__":
    main()
