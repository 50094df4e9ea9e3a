"""An image pipeline whose items are expensive to make: each one is augmented in the
Dataset's __getitem__ (random crop, flip, brightness and contrast jitter, Gaussian noise,
a blur), as torchvision transforms would, here in plain torch so nothing else is needed.
The work happens where DataLoader workers can take it off the training process, so the
number of workers and their prefetching matter here more than anywhere else.

    autotune run examples/augmented_images.py --trials 8
"""
import torch
from torch import nn
from torch.nn import functional as F

batch_size = 32
CLASSES = 10
SIZE = 40  # stored images; crops are 32 x 32


class Augmented(torch.utils.data.Dataset):
    """Class templates plus noise, stored once; every __getitem__ draws a fresh augmentation."""

    def __init__(self, n: int = 2048, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        templates = torch.randn(CLASSES, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(99))
        self.labels = torch.randint(0, CLASSES, (n,), generator=g)
        self.images = templates[self.labels] + 0.5 * torch.randn(n, 3, SIZE, SIZE, generator=g)
        kernel = torch.tensor([1.0, 4.0, 6.0, 4.0, 1.0])
        kernel = torch.outer(kernel, kernel) / kernel.sum() ** 2
        self.blur = kernel.expand(3, 1, 5, 5).contiguous()

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int):
        image = self.images[i]
        top, left = torch.randint(0, SIZE - 32 + 1, (2,)).tolist()
        image = image[:, top:top + 32, left:left + 32]
        if torch.rand(()) < 0.5:
            image = image.flip(-1)
        image = (image - image.mean()) * (0.8 + 0.4 * torch.rand(())) + image.mean() + 0.2 * torch.randn(())
        image = image + 0.1 * torch.randn_like(image)
        for _ in range(3):  # a blur of a random strength: the expensive part
            if torch.rand(()) < 0.7:
                image = F.conv2d(image.unsqueeze(0), self.blur, padding=2, groups=3).squeeze(0)
        return image, self.labels[i]


class SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(32 * 8 * 8, CLASSES))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def build_model() -> nn.Module:
    return SmallCNN()


def build_dataset() -> torch.utils.data.Dataset:
    return Augmented()


def build_optimizer(params) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.02, momentum=0.9)


def evaluate(model: nn.Module) -> float:
    """Accuracy on held-out items, center-cropped and not augmented."""
    # The model comes on its training device (a GPU in a CUDA run): the data goes there too.
    device = next(model.parameters()).device
    data = Augmented(n=256, seed=1)
    images = data.images[:, :, 4:36, 4:36].to(device)
    labels = data.labels.to(device)
    model.eval()
    with torch.no_grad():
        accuracy = (model(images).argmax(1) == labels).float().mean().item()
    model.train()
    return accuracy
