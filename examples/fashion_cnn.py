"""A Fashion-MNIST-shaped CNN (the book's chapter-1 model) on generated data.

28x28 grey images in 10 classes, 60,000 training items like the real set, made
from a fixed seed: nothing is downloaded. Each class is a noisy template, so the
model can learn and its loss falls.
"""
import torch
from torch import nn

batch_size = 64
NUM_ITEMS = 60_000


def _templates() -> torch.Tensor:
    return torch.randint(0, 154, (10, 1, 28, 28), generator=torch.Generator().manual_seed(0),
                         dtype=torch.uint8)


class FashionLike(torch.utils.data.Dataset):
    """Each class is a fixed template plus per-item noise; ``seed`` draws labels and noise."""

    def __init__(self, n: int = NUM_ITEMS, seed: int = 1) -> None:
        g = torch.Generator().manual_seed(seed)
        self.labels = torch.randint(0, 10, (n,), generator=g)
        noise = torch.randint(0, 102, (n, 1, 28, 28), generator=g, dtype=torch.uint8)
        # Stored as bytes and converted per item, as a decoded image set would be.
        self.images = _templates()[self.labels] + noise

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int):
        image = self.images[i].float().div_(255).sub_(0.286).div_(0.353)
        return image, self.labels[i]


class CNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(), nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


def build_model() -> nn.Module:
    return CNN()


def build_dataset() -> torch.utils.data.Dataset:
    return FashionLike()


def evaluate(model: nn.Module) -> float:
    """Accuracy on 2,000 held-out items: same classes, fresh noise."""
    # The model comes on its training device (a GPU in a CUDA run): the data goes there too.
    device = next(model.parameters()).device
    data = FashionLike(n=2_000, seed=12345)
    x = torch.stack([data[i][0] for i in range(len(data))]).to(device)
    labels = data.labels.to(device)
    was_training = model.training
    model.eval()
    with torch.no_grad():
        accuracy = (model(x).argmax(1) == labels).float().mean().item()
    model.train(was_training)
    return accuracy
