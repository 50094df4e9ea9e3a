"""A model whose every step takes about 1.5 s: slow, never hung."""
import time

import torch
from _common import dataset, mlp

batch_size = 16
STEP_S = 1.5


class Slow(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = mlp()

    def forward(self, x):
        time.sleep(STEP_S)
        return self.body(x)


def build_model():
    return Slow()


def build_dataset():
    return dataset()
