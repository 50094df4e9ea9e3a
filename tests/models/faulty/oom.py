"""forward keeps allocating 200 MB tensors and never lets go: memory grows without
bound, faster than one step, until the tuner's memory limit (or, without one, the
kernel) stops it."""
import torch
from _common import CLASSES, FEATURES, dataset

batch_size = 8
CHUNK_BYTES = 200 * 2**20
HOARD = []


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(FEATURES, CLASSES)

    def forward(self, x):
        while True:
            HOARD.append(torch.ones(CHUNK_BYTES // 4))  # ones, not empty: pages are touched


def build_model():
    return Net()


def build_dataset():
    return dataset()
