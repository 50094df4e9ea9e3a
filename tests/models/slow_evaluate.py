"""A small MLP whose evaluate() takes seconds (AUTOTUNE_TEST_EVALUATE_S, default 2 s a call):
stands for a model file that scores a validation set. Its data set takes as long to load a
batch as the model takes to train on it (as tests/models/slow_loading.py), so a candidate
with DataLoader workers is clearly faster and verification settles at its fewest rounds and
pairs."""
import os
import time

import torch

batch_size = 16
SECONDS_PER_SAMPLE = 0.0005
EVALUATE_S = float(os.environ.get("AUTOTUNE_TEST_EVALUATE_S", "2"))


class Slow(torch.utils.data.Dataset):
    def __init__(self):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(2048, 32, generator=g)
        self.y = self.x[:, :4].argmax(1)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        time.sleep(SECONDS_PER_SAMPLE)
        return self.x[i], self.y[i]


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))

    def forward(self, x):
        time.sleep(x.shape[0] * SECONDS_PER_SAMPLE)
        return self.body(x)


def build_model():
    return Net()


def build_dataset():
    return Slow()


def build_optimizer(params):
    return torch.optim.SGD(params, lr=0.05)


def evaluate(model):
    """1.0 while the model's outputs are finite: what matters here is its time, not its score
    (every batch the search tries trains as well by it)."""
    x = torch.randn(64, 32, generator=torch.Generator().manual_seed(1)).to(next(model.parameters()).device)
    with torch.no_grad():
        finite = bool(model(x).isfinite().all())
    time.sleep(EVALUATE_S)
    return float(finite)
