"""A CIFAR-10-shaped CNN (3x32x32, 10 classes) on generated data."""
import torch
from torch import nn

batch_size = 64


class CifarLike(torch.utils.data.Dataset):
    def __init__(self, n: int = 20_000, seed: int = 1) -> None:
        g = torch.Generator().manual_seed(seed)
        templates = torch.randint(0, 154, (10, 3, 32, 32), generator=torch.Generator().manual_seed(0),
                                  dtype=torch.uint8)
        self.labels = torch.randint(0, 10, (n,), generator=g)
        self.images = templates[self.labels] + torch.randint(0, 102, (n, 3, 32, 32), generator=g,
                                                             dtype=torch.uint8)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int):
        return self.images[i].float().div_(255).sub_(0.5).div_(0.25), self.labels[i]


def build_model() -> nn.Module:
    def block(cin, cout):
        return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(),
                             nn.MaxPool2d(2))

    return nn.Sequential(block(3, 32), block(32, 64), block(64, 128), nn.Flatten(),
                         nn.Linear(128 * 4 * 4, 256), nn.ReLU(), nn.Linear(256, 10))


def build_dataset():
    return CifarLike()


def evaluate(model: nn.Module) -> float:
    device = next(model.parameters()).device  # the model's training device: a GPU in a CUDA run
    data = CifarLike(n=1_000, seed=99)
    x = torch.stack([data[i][0] for i in range(len(data))]).to(device)
    model.eval()
    with torch.no_grad():
        acc = (model(x).argmax(1) == data.labels.to(device)).float().mean().item()
    model.train()
    return acc
