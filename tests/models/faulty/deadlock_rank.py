"""Rank 1 stops taking steps after a few: rank 0 waits in DDP's all-reduce forever
(a deadlocked rank). With one process it trains normally."""
import os
import time

import torch
from _common import CLASSES, FEATURES, dataset

batch_size = 8


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(FEATURES, CLASSES)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        if os.environ.get("RANK", "0") == "1" and self.calls > 5:
            time.sleep(3600)
        return self.fc(x)


def build_model():
    return Net()


def build_dataset():
    return dataset()
