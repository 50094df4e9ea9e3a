"""A model file whose dataset is a stream: an IterableDataset without a length.

It splits itself among DataLoader workers the way PyTorch's documentation shows, as a
user's existing stream would; autotune must still train on every item once per epoch.
Items are made from their index alone, so every process reads the same stream; the
order changes with the epoch (set_epoch)."""
import torch
from torch import nn

batch_size = 8
ITEMS = 256  # the stream's length, which autotune is not told
FEATURES = 12


class Stream(torch.utils.data.IterableDataset):
    def __init__(self, n: int = ITEMS) -> None:
        self.n, self.epoch = n, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        order = torch.randperm(self.n, generator=torch.Generator().manual_seed(self.epoch)).tolist()
        info = torch.utils.data.get_worker_info()
        if info is not None:  # each worker reads its own part
            order = order[info.id::info.num_workers]
        for i in order:
            yield item(i)


def item(i: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Item i of the stream: its features carry its index, so a test can tell items apart."""
    x = torch.randn(FEATURES, generator=torch.Generator().manual_seed(i))
    x[0] = float(i)
    return x, x[1:4].argmax()  # a target the model can learn


def build_model() -> nn.Module:
    return nn.Sequential(nn.Linear(FEATURES, 32), nn.ReLU(), nn.Linear(32, 3))


def build_dataset() -> torch.utils.data.Dataset:
    return Stream()


def build_optimizer(params) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.05)
