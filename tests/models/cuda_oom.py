"""Each forward pass asks the device for twice the memory it holds, sized from the GPU's
total memory (torch.cuda.get_device_properties): a real CUDA out-of-memory error from the
caching allocator, not a raised stand-in. Only tests/test_gpu.py runs it, on a GPU; on a
CPU it trains like any tiny model (nothing is allocated beyond it)."""
import torch
from torch import nn

batch_size = 32
FEATURES, CLASSES, ITEMS = 16, 4, 1024


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(FEATURES, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_cuda:
            total = torch.cuda.get_device_properties(x.device).total_memory
            # float32 elements: twice the device's bytes, as activations of a batch far too large
            activations = x.new_empty(2 * total // 4)
            x = x + activations[:1]
        return self.fc(x)


def build_model() -> nn.Module:
    return Net()


def build_dataset() -> torch.utils.data.Dataset:
    g = torch.Generator().manual_seed(0)
    return torch.utils.data.TensorDataset(torch.randn(ITEMS, FEATURES, generator=g),
                                          torch.randint(0, CLASSES, (ITEMS,), generator=g))
