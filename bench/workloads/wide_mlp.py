"""A wide MLP on tabular-like generated data: big matrix multiplies, trivial loading."""
import torch
from torch import nn

batch_size = 128


def build_model() -> nn.Module:
    return nn.Sequential(nn.Linear(512, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(),
                         nn.Linear(2048, 16))


def build_dataset():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(32_768, 512, generator=g)
    w = torch.randn(512, 16, generator=g)
    return torch.utils.data.TensorDataset(x, (x @ w).argmax(1))
