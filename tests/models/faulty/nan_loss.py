"""The loss becomes NaN after a few steps."""
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
        out = self.fc(x)
        return out * float("nan") if self.calls >= 3 else out


def build_model():
    return Net()


def build_dataset():
    return dataset()
