"""A small MLP whose steps sleep a fixed time per sample, so that the sleep, not the
arithmetic, sets its speed: stands for a candidate that looked faster in autotune's own
processes and, run alone, is level with the baseline but for each run's luck.

In autotune's trial processes batch 32 trains 1.5x as fast per sample as batch 16 (the
search and the side-by-side rounds find it faster). Run alone as train_tuned.py (which
trains through ``tuned_runtime``), batch 32's runs are in turn 1.7x and 0.5x as fast as
batch 16's, counted in the file $AUTOTUNE_TEST_LEVEL_COUNTER (without it, every run is the
fast one): its standalone pairs straddle 1x, and their median (of an even number, the mean
of the middle two) lies above it. The slow runs are slow enough that no other process's load
on the machine makes them read faster than the baseline's.
"""
import os
import sys
import time
from pathlib import Path

import torch

batch_size = 16
SECONDS_PER_SAMPLE = 0.002
COUNTER = os.environ.get("AUTOTUNE_TEST_LEVEL_COUNTER", "")
_speed: dict[int, float] = {}


def speed(batch: int) -> float:
    """Batch ``batch``'s speed per sample, against batch 16's; decided once per process."""
    if batch not in _speed:
        if batch == batch_size:
            _speed[batch] = 1.0
        elif "tuned_runtime" not in sys.modules:
            _speed[batch] = 1.5
        else:
            counter = Path(COUNTER) if COUNTER else None
            runs = int(counter.read_text() or 0) if counter is not None and counter.exists() else 0
            if counter is not None:
                counter.write_text(str(runs + 1))
            _speed[batch] = 1.7 if runs % 2 == 0 else 0.5
    return _speed[batch]


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))

    def forward(self, x):
        time.sleep(x.shape[0] * SECONDS_PER_SAMPLE / speed(x.shape[0]))
        return self.body(x)


def build_model():
    return Net()


def build_dataset():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4096, 32, generator=g)
    return torch.utils.data.TensorDataset(x, x[:, :4].argmax(1))


def build_optimizer(params):
    return torch.optim.SGD(params, lr=0.05)
