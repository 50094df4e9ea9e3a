"""The loss is NaN under every configuration."""
import torch

batch_size = 16


def build_model():
    return torch.nn.Linear(8, 2)


def build_dataset():
    g = torch.Generator().manual_seed(0)
    return torch.utils.data.TensorDataset(torch.randn(256, 8, generator=g),
                                          torch.randint(0, 2, (256,), generator=g))


def loss_fn(outputs, targets):
    return torch.nn.functional.cross_entropy(outputs, targets) * float("nan")
