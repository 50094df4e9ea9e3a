"""A small MLP of repeated blocks, for the memory knobs' tests: 16 features in 4
classes, 256 items; each Block (Linear, LayerNorm, ReLU) occurs four times. AdamW, whose
state is twice the weights, as in the models sharding is for. WIDTH (environment
variable BLOCKS_WIDTH) makes the blocks wider for the memory test."""
import os

import torch
from torch import nn

WIDTH = int(os.environ.get("BLOCKS_WIDTH", "32"))
FEATURES, CLASSES, NUM_ITEMS = 16, 4, 256
batch_size = 16


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width)
        self.norm = nn.LayerNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.relu(self.norm(self.linear(x)))


class BlocksMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(FEATURES, WIDTH)
        self.blocks = nn.ModuleList(Block(WIDTH) for _ in range(4))
        self.head = nn.Linear(WIDTH, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


class Points(torch.utils.data.Dataset):
    def __init__(self, n: int = NUM_ITEMS, seed: int = 1) -> None:
        g = torch.Generator().manual_seed(seed)
        centers = torch.randn(CLASSES, FEATURES, generator=torch.Generator().manual_seed(0))
        self.labels = torch.randint(0, CLASSES, (n,), generator=g)
        self.points = centers[self.labels] + 0.5 * torch.randn(n, FEATURES, generator=g)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int):
        return self.points[i], self.labels[i]


def build_model() -> nn.Module:
    return BlocksMLP()


def build_dataset() -> torch.utils.data.Dataset:
    return Points()


def build_optimizer(params) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=1e-2)


def evaluate(model: nn.Module) -> float:
    device = next(model.parameters()).device  # the model's training device: a GPU in a CUDA run
    data = Points(64, seed=2)
    points, labels = data.points.to(device), data.labels.to(device)
    with torch.no_grad():
        predicted = model(points).argmax(1)
    return float((predicted == labels).float().mean())
