"""A small MLP whose data set takes as long to load a batch as the model takes to train on
it: both sleep, a fixed time per sample. Without DataLoader workers (the baseline) a step
loads, then trains; with one worker or more, loading overlaps training and a step takes
the longer of the two, not their sum. The sleeps, not the arithmetic, set the speeds, so
the candidate is clearly faster on any CPU and beside any other load, and every stage of
the verification settles at its fewest rounds and pairs."""
import time

import torch

batch_size = 16
SECONDS_PER_SAMPLE = 0.0005


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
