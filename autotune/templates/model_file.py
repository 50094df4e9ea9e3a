"""My model, as autotune reads it: fill in the functions below, then run
`autotune run THIS_FILE`. Only build_model and build_dataset are required; everything
else has a default. Keep this file quick to import: autotune checks it in a separate
process, with one real training step on two items, before any trial.
"""
import torch
from torch import nn

# The batch size you train with today: the baseline every speedup is measured against.
batch_size = 32


def build_model() -> nn.Module:
    """A fresh model (autotune builds one per trial, from the same seed)."""
    # Replace with your own model, e.g. `return MyNet()` or a library model.
    return nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 256), nn.ReLU(), nn.Linear(256, 10))


def build_dataset() -> torch.utils.data.Dataset:
    """The training set: map-style, items are (inputs, targets); or an IterableDataset
    that yields the same items in the same order in every process (autotune shards it;
    see the README). Load from local files (paths relative to where you run autotune);
    nothing may be downloaded in a trial."""
    # Replace with your own, e.g. `return MyDataset("data/train")`.
    generator = torch.Generator().manual_seed(0)
    images = torch.randn(2048, 3, 32, 32, generator=generator)
    labels = torch.randint(0, 10, (2048,), generator=generator)
    return torch.utils.data.TensorDataset(images, labels)


# --- optional: delete what you do not need ----------------------------------------


def loss_fn(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Default: cross-entropy."""
    return nn.functional.cross_entropy(outputs, targets)


def build_optimizer(params) -> torch.optim.Optimizer:
    """Default: AdamW(lr=1e-3)."""
    return torch.optim.AdamW(params, lr=1e-3)


# def training_step(model, batch) -> torch.Tensor:
#     """Replaces model(inputs) + loss_fn(outputs, targets): for models with their own
#     calling convention, e.g. `return model(**batch).loss` for dict batches."""


# def collate_fn(items):
#     """Handed to the DataLoader as its collate_fn."""


def evaluate(model: nn.Module) -> float:
    """A quality metric, higher is better (here: accuracy on held-out data). With it,
    autotune checks that reduced precision keeps quality, and can offer pruning.
    It gets the model on its training device (a GPU when training runs on one):
    move your inputs there."""
    device = next(model.parameters()).device
    generator = torch.Generator().manual_seed(1)
    images = torch.randn(256, 3, 32, 32, generator=generator).to(device)
    labels = torch.randint(0, 10, (256,), generator=generator).to(device)
    was_training = model.training
    model.eval()
    with torch.no_grad():
        accuracy = (model(images).argmax(1) == labels).float().mean().item()
    model.train(was_training)
    return accuracy
