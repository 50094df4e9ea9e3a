"""A small MLP whose optimizer has two parameter groups, each with hyperparameters of its
own: rebuilding its step (optimizer_step) must keep them."""
import torch
from torch import nn

batch_size = 16


def build_model():
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))


def build_dataset():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 8, generator=g)
    return torch.utils.data.TensorDataset(x, (x[:, 0] > 0).long() + (x[:, 1] > 0).long())


def build_optimizer(params):
    params = list(params)
    return torch.optim.SGD([{"params": params[:2], "lr": 0.05, "weight_decay": 0.01},
                            {"params": params[2:]}], lr=0.01, momentum=0.9)
