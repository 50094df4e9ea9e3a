"""A small CNN with BatchNorm, trained by Adam on a small synthetic image set: where its
short training lands depends on its seed (fp32's seeds end far apart), as the user's CNN in
issue 72 did; bf16 autocast changes nothing the seed does not."""
import torch
from torch import nn

batch_size = 32
_SIZE, _CLASSES = 12, 4


def _images(n: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    protos = torch.randn(_CLASSES, 1, _SIZE, _SIZE, generator=torch.Generator().manual_seed(7))
    y = torch.randint(0, _CLASSES, (n,), generator=g)
    x = protos[y] + 2.5 * torch.randn(n, 1, _SIZE, _SIZE, generator=g)
    return x, y


def build_model() -> nn.Module:
    return nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, _CLASSES))


def build_dataset():
    return torch.utils.data.TensorDataset(*_images(1600, 0))


def build_optimizer(params):
    return torch.optim.Adam(params, lr=3e-3)


def evaluate(model: nn.Module) -> float:
    device = next(model.parameters()).device
    x, y = (t.to(device) for t in _images(400, 1))
    was = model.training
    model.eval()
    with torch.no_grad():
        acc = (model(x).argmax(1) == y).float().mean().item()
    model.train(was)
    return acc
