"""Residual blocks of LayerNorm, a linear layer and a gated GELU on narrow activations:
many elementwise operations around small matrix multiplies, which eager PyTorch runs one
kernel (and one pass over memory) at a time and torch.compile fuses. Compiling it takes
tens of seconds on a small CPU: it pays off only over a long enough run."""
import torch
from torch import nn

batch_size = 1024


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(self.norm(x))
        return x + nn.functional.gelu(h) * torch.sigmoid(h) * 0.5


def build_model() -> nn.Module:
    return nn.Sequential(nn.Linear(64, 256), *[Block(256) for _ in range(8)], nn.Linear(256, 10))


def build_dataset():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(32_768, 64, generator=g)
    w = torch.randn(64, 10, generator=g)
    return torch.utils.data.TensorDataset(x, (x @ w).argmax(1))
