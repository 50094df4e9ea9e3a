"""A model that computes its own loss, in plain PyTorch: forward(inputs, targets) returns
the cross-entropy, and training_step calls it (what transformers' models do with labels).
Compiled, the loss is an output of the compiled graph: under reduce-overhead a CUDA graph's
output buffer, overwritten by the next replay unless the trainer reads or copies it first.

Each of 4 classes is a fixed random template plus per-item noise (fixed seeds), so the loss
falls within a few dozen steps."""
import torch
from torch import nn

batch_size = 32
FEATURES, CLASSES, ITEMS = 32, 4, 2048


class Blobs(torch.utils.data.Dataset):
    def __init__(self, n: int = ITEMS, seed: int = 1) -> None:
        g = torch.Generator().manual_seed(seed)
        templates = torch.randn(CLASSES, FEATURES, generator=torch.Generator().manual_seed(0))
        self.labels = torch.randint(0, CLASSES, (n,), generator=g)
        self.inputs = templates[self.labels] + 0.5 * torch.randn(n, FEATURES, generator=g)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int):
        return self.inputs[i], self.labels[i]


class WithLoss(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(FEATURES, 64), nn.ReLU(), nn.Linear(64, CLASSES))

    def forward(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(self.body(inputs), targets)


def build_model() -> nn.Module:
    return WithLoss()


def build_dataset() -> torch.utils.data.Dataset:
    return Blobs()


def build_optimizer(params) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.05, momentum=0.9)


def training_step(model: nn.Module, batch) -> torch.Tensor:
    inputs, targets = batch
    return model(inputs, targets)
