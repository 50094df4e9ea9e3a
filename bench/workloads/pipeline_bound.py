"""A small model behind CPU-heavy per-item transforms: the data pipeline is the
bottleneck, so DataLoader workers should matter more than threads."""
import torch
from torch import nn

batch_size = 32


class Augmented(torch.utils.data.Dataset):
    def __init__(self, n: int = 8_000) -> None:
        g = torch.Generator().manual_seed(0)
        self.images = torch.randint(0, 256, (n, 3, 48, 48), generator=g, dtype=torch.uint8)
        self.labels = torch.randint(0, 10, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int):
        x = self.images[i].float() / 255
        g = torch.Generator().manual_seed(i)
        # Per-item work like decoding + augmentation: blur, random crop, flip, jitter.
        kernel = torch.ones(3, 1, 5, 5) / 25
        for _ in range(3):
            x = torch.nn.functional.conv2d(x.unsqueeze(0), kernel, padding=2, groups=3).squeeze(0)
        top, left = torch.randint(0, 17, (2,), generator=g).tolist()
        x = x[:, top : top + 32, left : left + 32]
        if torch.rand(1, generator=g).item() < 0.5:
            x = x.flip(2)
        x = (x - x.mean()) / (x.std() + 1e-5) * (0.8 + 0.4 * torch.rand(1, generator=g))
        return x, self.labels[i]


def build_model() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(4),
                         nn.Flatten(), nn.Linear(256, 10))


def build_dataset():
    return Augmented()
