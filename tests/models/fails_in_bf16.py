"""A model file whose forward raises under bf16 autocast: a configuration of one process
that fails while another of the same process knobs (fp32) trains."""
import torch
from torch import nn

batch_size = 16


class NoAutocast(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_autocast_enabled("cpu"):
            raise ValueError("NoAutocast cannot run under autocast")
        return self.fc(x)


def build_model() -> nn.Module:
    return NoAutocast()


def build_dataset() -> torch.utils.data.Dataset:
    g = torch.Generator().manual_seed(0)
    return torch.utils.data.TensorDataset(torch.randn(512, 16, generator=g),
                                          torch.randint(0, 4, (512,), generator=g))
