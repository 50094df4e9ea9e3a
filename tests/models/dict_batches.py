"""A model file in a library model's style: items are dicts whose image is not the first
entry, the model takes keyword arguments and returns an output with a .loss, and
training_step is a lambda, as for a Hugging Face model."""
import dataclasses

import torch
from torch import nn

batch_size = 8


@dataclasses.dataclass
class Output:
    loss: torch.Tensor
    logits: torch.Tensor


class ImageClassifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.head = nn.Linear(8, 4)

    def forward(self, pixel_values: torch.Tensor, labels: torch.Tensor) -> Output:
        logits = self.head(self.conv(pixel_values).relu().mean((2, 3)))
        return Output(loss=nn.functional.cross_entropy(logits, labels), logits=logits)


class Items(torch.utils.data.Dataset):
    def __init__(self, n: int = 64) -> None:
        g = torch.Generator().manual_seed(0)
        self.labels = torch.randint(0, 4, (n,), generator=g)
        self.images = torch.randn(n, 3, 8, 8, generator=g) + self.labels.view(-1, 1, 1, 1)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict:
        return {"labels": self.labels[i], "pixel_values": self.images[i]}


def build_model() -> nn.Module:
    return ImageClassifier()


def build_dataset() -> torch.utils.data.Dataset:
    return Items()


training_step = lambda model, batch: model(**batch).loss  # noqa: E731  (as users write it)
