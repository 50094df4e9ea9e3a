"""An MLP trained at batch 16 on tabular-like generated data: each step is too small to
keep the cores busy, so throughput keeps rising with the batch far past eight times it.
The classes are an easy function of the inputs, so a larger batch with its learning rate
scaled (--scale-lr) can learn as well over the same samples; evaluate() is held-out
accuracy."""
import torch
from torch import nn

batch_size = 16
FEATURES = 64


def _data(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(FEATURES, 8, generator=torch.Generator().manual_seed(7))
    x = torch.randn(n, FEATURES, generator=g)
    return x, (x @ w).argmax(1)


def build_model() -> nn.Module:
    return nn.Sequential(nn.Linear(FEATURES, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 8))


def build_dataset():
    return torch.utils.data.TensorDataset(*_data(65_536, 0))


def evaluate(model: nn.Module) -> float:
    device = next(model.parameters()).device
    x, y = (t.to(device) for t in _data(4096, 1))
    model.eval()
    with torch.no_grad():
        accuracy = (model(x).argmax(1) == y).float().mean().item()
    model.train()
    return accuracy
