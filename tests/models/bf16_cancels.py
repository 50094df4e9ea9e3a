"""A model that bf16 breaks: its output is the small difference of two large matrix
products (catastrophic cancellation). In fp32 the difference is exact enough and the
model learns; bf16's 8-bit mantissa rounds each product by far more than the
difference, so under bf16 autocast the loss stops falling."""
import torch
from torch import nn

batch_size = 32


class Cancelling(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(3)
        self.register_buffer("big", 200.0 * torch.randn(4, 16, generator=g))
        self.small = nn.Parameter(torch.zeros(4, 16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(x, self.big + self.small) - nn.functional.linear(x, self.big)


def build_model() -> nn.Module:
    return Cancelling()


def build_dataset():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2048, 16, generator=g)
    return torch.utils.data.TensorDataset(x, (x[:, :4]).argmax(1))


def build_optimizer(params):
    return torch.optim.SGD(params, lr=0.5)


def evaluate(model: nn.Module) -> float:
    device = next(model.parameters()).device  # the model's training device: a GPU in a CUDA run
    x, y = (t.to(device) for t in build_dataset().tensors)
    with torch.no_grad():
        return (model(x).argmax(1) == y).float().mean().item()
