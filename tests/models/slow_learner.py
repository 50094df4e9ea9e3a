"""A linear regression under plain SGD whose learning rate suits its batch of 16: over the
same samples, a batch 16 times larger takes 16 times fewer steps of the same size and
stops far short, unless its learning rate grows with it (the linear scaling rule).
evaluate() is R^2 on held-out points (1.0: perfect; higher is better)."""
import torch
from torch import nn

batch_size = 16
FEATURES = 16


def _points(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(FEATURES, 1, generator=torch.Generator().manual_seed(7))
    x = torch.randn(n, FEATURES, generator=g)
    return x, x @ w + 0.01 * torch.randn(n, 1, generator=g)


def build_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Linear(FEATURES, 1)


def build_dataset():
    return torch.utils.data.TensorDataset(*_points(8192, 0))


def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(output, target)


def build_optimizer(params):
    return torch.optim.SGD(params, lr=0.01)


def evaluate(model: nn.Module) -> float:
    device = next(model.parameters()).device
    x, y = (t.to(device) for t in _points(1024, 1))
    with torch.no_grad():
        residual = ((model(x) - y) ** 2).mean()
    return 1.0 - (residual / y.var()).item()
