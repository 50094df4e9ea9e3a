"""build_dataset holds 512 MiB in memory (written, so resident), which the DataLoader's
forked workers share with the trial process copy-on-write: the tree holds it once, while
each of its processes has it resident."""
import torch
from _common import CLASSES, FEATURES, tensors

batch_size = 8
HELD_BYTES = 512 * 2**20


class Held(torch.utils.data.Dataset):
    def __init__(self):
        self.blob = b"\x01" * HELD_BYTES
        self.x, self.y = tensors()

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i] + self.blob[i], self.y[i]


def build_model():
    return torch.nn.Linear(FEATURES, CLASSES)


def build_dataset():
    return Held()
