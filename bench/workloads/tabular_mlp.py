"""A tabular MLP trained at batch 16: 96 numeric features on very different scales (as
raw columns of a table are: counts, amounts, ratios), standardized inside the model,
three hidden layers of 512, 256 and 256 units, 6 classes given by a fixed random teacher
network. Each step is small, so the batch and the process layout matter more than
the arithmetic. No evaluate(): nothing judges quality, so a larger batch is compared on
speed alone."""
import torch
from torch import nn

batch_size = 16
FEATURES, CLASSES, ITEMS = 96, 6, 65_536


def _scales() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(11)
    # each column its own order of magnitude (1e-2 to 1e3) and offset
    scale = 10 ** (torch.rand(FEATURES, generator=g) * 5 - 2)
    offset = torch.randn(FEATURES, generator=g) * scale
    return scale, offset


class Standardize(nn.Module):
    """Fixed per-column standardization, as a preprocessing step fitted on the table."""

    def __init__(self) -> None:
        super().__init__()
        scale, offset = _scales()
        self.register_buffer("scale", scale)
        self.register_buffer("offset", offset)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.offset) / self.scale


def build_model() -> nn.Module:
    return nn.Sequential(Standardize(),
                         nn.Linear(FEATURES, 512), nn.ReLU(),
                         nn.Linear(512, 256), nn.ReLU(),
                         nn.Linear(256, 256), nn.ReLU(),
                         nn.Linear(256, CLASSES))


def build_dataset():
    g = torch.Generator().manual_seed(0)
    z = torch.randn(ITEMS, FEATURES, generator=g)
    teacher = torch.Generator().manual_seed(7)
    w1 = torch.randn(FEATURES, 32, generator=teacher)
    w2 = torch.randn(32, CLASSES, generator=teacher)
    labels = (torch.tanh(z @ w1 / FEATURES ** 0.5) @ w2).argmax(1)
    scale, offset = _scales()
    return torch.utils.data.TensorDataset(z * scale + offset, labels)
