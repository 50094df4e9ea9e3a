"""A stack of convolution blocks whose activations, not its weights, fill the memory: at its
batch of 64 a training step holds about 1.3 GB of activations (14 blocks of a depthwise
3x3 and a pointwise convolution with a GELU between them, on 32 channels of 64x64), while
its weights are 20 thousand numbers. Tuned under a memory limit it cannot meet as written
(`--memory-limit 1G --fix batch_size=64`), it needs the memory knobs: activation
checkpointing over its blocks, or gradient accumulation (it has no BatchNorm).

    autotune run bench/workloads/conv_stack.py --memory-limit 1G --fix batch_size=64 --trials 8
"""
import torch
from torch import nn

batch_size = 64
CHANNELS, SIZE, BLOCKS, CLASSES, ITEMS = 32, 64, 14, 10, 2_048


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.depthwise = nn.Conv2d(CHANNELS, CHANNELS, 3, padding=1, groups=CHANNELS)
        self.pointwise = nn.Conv2d(CHANNELS, CHANNELS, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.pointwise(nn.functional.gelu(self.depthwise(x)))


class ConvStack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, CHANNELS, 3, padding=1)
        self.blocks = nn.Sequential(*(Block() for _ in range(BLOCKS)))
        self.head = nn.Linear(CHANNELS, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.stem(x)).mean(dim=(2, 3)))


class Images(torch.utils.data.Dataset):
    """Noise images whose class is which quadrant is brightest (and a tenth of the
    classes' offsets), drawn per item from its own seed: nothing is held in memory."""

    def __len__(self) -> int:
        return ITEMS

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        g = torch.Generator().manual_seed(i)
        label = i % CLASSES
        image = torch.randn(3, SIZE, SIZE, generator=g)
        half = SIZE // 2
        row, col = divmod(label % 4, 2)
        image[:, row * half:(row + 1) * half, col * half:(col + 1) * half] += 1.0 + label / CLASSES
        return image, label


def build_model() -> nn.Module:
    return ConvStack()


def build_dataset() -> torch.utils.data.Dataset:
    return Images()


def build_optimizer(params) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=1e-3)
