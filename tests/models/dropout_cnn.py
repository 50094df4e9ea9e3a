"""tiny_cnn with dropout and a shuffled 256-item dataset: a resumed run reproduces an
uninterrupted one only if the model, the optimizer's momentum, the random generators
(dropout draws from them) and the data position (mid-epoch, across epochs) all carry over."""
import torch
from torch import nn

batch_size = 16
CLASSES = 4


class Blobs(torch.utils.data.Dataset):
    def __init__(self, n: int = 256, seed: int = 1) -> None:
        g = torch.Generator().manual_seed(seed)
        templates = torch.randn(CLASSES, 3, 8, 8, generator=torch.Generator().manual_seed(0))
        self.labels = torch.randint(0, CLASSES, (n,), generator=g)
        self.images = templates[self.labels] + 0.5 * torch.randn(n, 3, 8, 8, generator=g)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int):
        return self.images[i], self.labels[i]


def build_model() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                         nn.Dropout(0.3), nn.Linear(8 * 4 * 4, CLASSES))


def build_dataset() -> torch.utils.data.Dataset:
    return Blobs()


def build_optimizer(params) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.05, momentum=0.9)


def evaluate(model: nn.Module) -> float:
    device = next(model.parameters()).device  # the model's training device: a GPU in a CUDA run
    data = Blobs(n=128, seed=99)
    images, labels = data.images.to(device), data.labels.to(device)
    model.eval()
    with torch.no_grad():
        return (model(images).argmax(1) == labels).float().mean().item()
