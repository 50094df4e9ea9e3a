"""Trains at its own batch size (16) with num_workers=0, as the baseline does; fails
for larger batches (forward raises) and in every DataLoader worker (__getitem__
raises), so a study meets failures among its good trials and must go on."""
import torch
from _common import CLASSES, FEATURES, tensors

batch_size = 16


class Data(torch.utils.data.Dataset):
    def __init__(self):
        self.x, self.y = tensors(2048)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        if torch.utils.data.get_worker_info() is not None:
            raise ValueError("deliberate failure in a DataLoader worker (fault-injection test)")
        return self.x[i], self.y[i]


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(FEATURES, CLASSES)

    def forward(self, x):
        if x.shape[0] > batch_size:
            raise RuntimeError(f"a batch of {x.shape[0]} is too large (fault-injection test)")
        return self.fc(x)


def build_model():
    return Net()


def build_dataset():
    return Data()
