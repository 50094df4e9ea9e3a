"""The data and the model of the noisy scripts (noisy_trainer.py, noisy_lightning.py): small
noisy images of four classes and a small CNN with BatchNorm, whose short training lands where
its seed takes it (as tests/models/noisy_cnn.py, the calibration model)."""
import torch
from torch import nn

SIZE, CLASSES = 12, 4


def images(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    protos = torch.randn(CLASSES, 1, SIZE, SIZE, generator=torch.Generator().manual_seed(7))
    y = torch.randint(0, CLASSES, (n,), generator=g)
    return protos[y] + 2.5 * torch.randn(n, 1, SIZE, SIZE, generator=g), y


def cnn() -> nn.Module:
    return nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, CLASSES))
