"""Rank 1 runs out of GPU memory in its third forward pass; rank 0 goes on into the
gradient all-reduce and waits there for it, as on a real node where one GPU holds a
little more than the others. Only tests/test_gpu.py runs it (2 GPUs, NCCL)."""
import os

import torch
from torch import nn

batch_size = 32
FEATURES, CLASSES, ITEMS = 16, 4, 1024
_calls = [0]


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(FEATURES, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _calls[0] += 1
        if os.environ.get("RANK") == "1" and _calls[0] >= 3:
            raise torch.cuda.OutOfMemoryError(
                "CUDA out of memory. Tried to allocate 20.00 GiB. GPU 1 has a total capacity of 79.19 GiB")
        return self.fc(x)


def build_model() -> nn.Module:
    return Net()


def build_dataset() -> torch.utils.data.Dataset:
    g = torch.Generator().manual_seed(0)
    return torch.utils.data.TensorDataset(torch.randn(ITEMS, FEATURES, generator=g),
                                          torch.randint(0, CLASSES, (ITEMS,), generator=g))
