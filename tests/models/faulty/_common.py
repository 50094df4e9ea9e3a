"""Shared pieces of the fault-injection model files (imported as a neighbour: the
tuner puts a model file's folder first on sys.path)."""
import torch

FEATURES, CLASSES, ITEMS = 16, 4, 512


def tensors(n=ITEMS):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, FEATURES, generator=g)
    y = torch.randint(0, CLASSES, (n,), generator=g)
    return x, y


def dataset(n=ITEMS):
    return torch.utils.data.TensorDataset(*tensors(n))


def mlp():
    return torch.nn.Sequential(
        torch.nn.Linear(FEATURES, 32), torch.nn.ReLU(), torch.nn.Linear(32, CLASSES)
    )
