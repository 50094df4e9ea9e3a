"""Trains with num_workers=0; every DataLoader worker raises in __getitem__, so only
the configurations with num_workers > 0 fail (a study must go on without them)."""
import torch
from _common import mlp, tensors

batch_size = 16


class Data(torch.utils.data.Dataset):
    def __init__(self):
        self.x, self.y = tensors(2048)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        if torch.utils.data.get_worker_info() is not None:
            raise ValueError("deliberate failure in a DataLoader worker (fault-injection test)")
        return self.x[i], self.y[i]


def build_model():
    return mlp()


def build_dataset():
    return Data()
