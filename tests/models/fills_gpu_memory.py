"""A model that holds most of a GPU's memory, as a real one at its best batch does: a
fixed share (weights, optimizer state, CUDA context) and a share per sample (activations),
sized from the GPU's total memory (torch.cuda.mem_get_info) so that every GPU sees the
same proportions. At the user's batch one process holds 45% of the GPU: two held side
by side on one GPU, or an fp32 reference at a global batch meant for several GPUs, run
out of memory. The compute is a small MLP: the tuner's steps stay quick.

On a CPU it holds nothing extra (only tests/test_gpu.py runs it, on a GPU).
"""
import torch
from torch import nn

batch_size = 16
FEATURES, CLASSES, ITEMS = 64, 8, 4096
FIXED_SHARE = 0.25             # of the GPU's memory, whatever the batch
PER_SAMPLE_SHARE = 0.20 / 16   # of the GPU's memory, per sample of a rank's batch
_HELD: dict = {}               # the fixed share, per device, for the process's lifetime


def _share_bytes(device: torch.device, share: float) -> int:
    _, total = torch.cuda.mem_get_info(device)
    return int(total * share)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(FEATURES, 256), nn.ReLU(), nn.Linear(256, CLASSES))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type == "cuda" and x.device not in _HELD:
            _HELD[x.device] = torch.ones(_share_bytes(x.device, FIXED_SHARE), dtype=torch.uint8, device=x.device)
        if x.device.type == "cuda" and torch.is_grad_enabled():  # evaluation keeps no activations
            # Freed after the step, yet kept reserved by PyTorch's caching allocator, as
            # activations are: the process holds its peak from then on.
            scratch = torch.ones(_share_bytes(x.device, PER_SAMPLE_SHARE) * x.shape[0], dtype=torch.uint8,
                                 device=x.device)
            del scratch
        return self.body(x)


def build_model() -> nn.Module:
    return Net()


def build_dataset() -> torch.utils.data.Dataset:
    g = torch.Generator().manual_seed(0)
    centers = torch.randn(CLASSES, FEATURES, generator=g) * 2
    labels = torch.randint(0, CLASSES, (ITEMS,), generator=g)
    return torch.utils.data.TensorDataset(centers[labels] + torch.randn(ITEMS, FEATURES, generator=g), labels)


def evaluate(model: nn.Module) -> float:
    device = next(model.parameters()).device  # the model's training device: a GPU in a CUDA run
    x, y = (t.to(device) for t in build_dataset().tensors)
    model.eval()
    with torch.no_grad():
        accuracy = (model(x[:512]).argmax(1) == y[:512]).float().mean().item()
    model.train()
    return accuracy
