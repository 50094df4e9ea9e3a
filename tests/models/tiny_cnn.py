"""A tiny learnable CNN for autotune's tests: 3x8x8 images in 4 classes, 512 items.

Each class is a fixed random template plus per-item noise (fixed seeds: every process and
every rank sees the same data), so the loss falls within a few dozen steps.
"""
import torch
from torch import nn

batch_size = 16
NUM_ITEMS = 512
CLASSES = 4


def _templates() -> torch.Tensor:
    return torch.randn(CLASSES, 3, 8, 8, generator=torch.Generator().manual_seed(0))


class Blobs(torch.utils.data.Dataset):
    def __init__(self, n: int = NUM_ITEMS, seed: int = 1) -> None:
        g = torch.Generator().manual_seed(seed)
        self.labels = torch.randint(0, CLASSES, (n,), generator=g)
        self.images = _templates()[self.labels] + 0.5 * torch.randn(n, 3, 8, 8, generator=g)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int):
        return self.images[i], self.labels[i]


class TinyCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(8 * 4 * 4, CLASSES))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


def build_model() -> nn.Module:
    return TinyCNN()


def build_dataset() -> torch.utils.data.Dataset:
    return Blobs()


def build_optimizer(params) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.05, momentum=0.9)


def evaluate(model: nn.Module) -> float:
    device = next(model.parameters()).device  # the model's training device: a GPU in a CUDA run
    data = Blobs(n=256, seed=99)
    images, labels = data.images.to(device), data.labels.to(device)
    was_training = model.training
    model.eval()
    with torch.no_grad():
        accuracy = (model(images).argmax(1) == labels).float().mean().item()
    model.train(was_training)
    return accuracy
