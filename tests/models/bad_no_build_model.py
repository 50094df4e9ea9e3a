"""A model file that breaks the contract: it defines no build_model()."""
import torch

batch_size = 8


def build_dataset():
    return torch.utils.data.TensorDataset(torch.randn(16, 4), torch.randint(0, 2, (16,)))
