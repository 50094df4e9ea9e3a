"""Items from index 300 on never return (a data server that stops answering): the
contract check's two items pass, and a trial blocks in its first shuffled batch, before
any step, where no heartbeat can tell."""
import time

import torch
from _common import mlp, tensors

batch_size = 16


class StopsAnswering(torch.utils.data.Dataset):
    def __init__(self):
        self.x, self.y = tensors()

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        if i >= 300:
            time.sleep(3600)
        return self.x[i], self.y[i]


def build_model():
    return mlp()


def build_dataset():
    return StopsAnswering()
