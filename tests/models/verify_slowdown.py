"""A small MLP whose steps at batch size 64 become slow once a marker file exists:
stands for a candidate that was fast during the search and is not any more."""
import os
import time

import torch

batch_size = 16
MARKER = os.environ.get("AUTOTUNE_TEST_SLOW_MARKER", "")


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))

    def forward(self, x):
        if x.shape[0] == 64 and MARKER and os.path.exists(MARKER):
            time.sleep(0.05)
        return self.body(x)


def build_model():
    return Net()


def build_dataset():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4096, 32, generator=g)
    return torch.utils.data.TensorDataset(x, (x[:, :4].argmax(1)))
