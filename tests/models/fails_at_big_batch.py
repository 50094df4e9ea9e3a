"""A model file whose forward raises for batches of 128 rows or more (read from the
input's shape): the user's error in some configurations, not all."""
import torch
from torch import nn

batch_size = 16
LIMIT = 128


class Picky(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] >= LIMIT:
            raise ValueError(f"Picky cannot take a batch of {x.shape[0]} rows (limit {LIMIT})")
        return self.fc(x)


def build_model() -> nn.Module:
    return Picky()


def build_dataset() -> torch.utils.data.Dataset:
    g = torch.Generator().manual_seed(0)
    return torch.utils.data.TensorDataset(torch.randn(512, 16, generator=g),
                                          torch.randint(0, 4, (512,), generator=g))
