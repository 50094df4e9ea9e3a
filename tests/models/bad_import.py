"""A model file whose import fails inside the user's own code."""
import torch


def _read_settings():
    import autotune_test_no_such_module  # noqa: F401  (the user's mistake)


_read_settings()


def build_model():
    return torch.nn.Linear(4, 2)


def build_dataset():
    return torch.utils.data.TensorDataset(torch.randn(16, 4), torch.randint(0, 2, (16,)))
