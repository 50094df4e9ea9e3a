"""A model that trains as well in bf16 as in fp32, but whose short training lands where
its seed takes it: noisy labels, a small batch and a large learning rate keep the weights
moving, and evaluate() scores a small held-out set. Two fp32 trainings from two seeds
differ by more than 2% of the score, and a bf16 training from fp32's own seed drifts
from it as another seed's would."""
import torch
from torch import nn

batch_size = 16
_FEATURES, _CLASSES = 20, 4


def _data(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(_CLASSES, _FEATURES, generator=torch.Generator().manual_seed(7))
    y = torch.randint(0, _CLASSES, (n,), generator=g)
    x = centres[y] + 1.6 * torch.randn(n, _FEATURES, generator=g)
    flipped = torch.rand(n, generator=g) < 0.2  # noisy labels: the weights never settle
    y = torch.where(flipped, torch.randint(0, _CLASSES, (n,), generator=g), y)
    return x, y


def build_model() -> nn.Module:
    return nn.Sequential(nn.Linear(_FEATURES, 64), nn.ReLU(), nn.Linear(64, _CLASSES))


def build_dataset():
    return torch.utils.data.TensorDataset(*_data(4096, 0))


def build_optimizer(params):
    return torch.optim.SGD(params, lr=0.06, momentum=0.9)


def evaluate(model: nn.Module) -> float:
    device = next(model.parameters()).device
    x, y = (t.to(device) for t in _data(400, 1))
    with torch.no_grad():
        return (model(x).argmax(1) == y).float().mean().item()
