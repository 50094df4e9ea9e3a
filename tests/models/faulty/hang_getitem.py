"""A dataset whose __getitem__ blocks after N items in each process (so in each
DataLoader worker too): a hang after steps have started, for the heartbeat."""
import time

import torch
from _common import mlp, tensors

batch_size = 8
BLOCK_AFTER = 64  # items served per process before blocking


class BlockingDataset(torch.utils.data.Dataset):
    def __init__(self):
        self.x, self.y = tensors()
        self.served = 0

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        self.served += 1
        if self.served > BLOCK_AFTER:
            time.sleep(3600)
        return self.x[i], self.y[i]


def build_model():
    return mlp()


def build_dataset():
    return BlockingDataset()
