"""A Lightning script whose model bf16 breaks (as tests/models/bf16_cancels.py): its output is
the small difference of two large matrix products, which bf16's 8-bit mantissa rounds away,
so under bf16 autocast the loss stops falling. Validation accuracy is logged each epoch.

    python bench/workloads/cancels_lightning.py
    autotune run bench/workloads/cancels_lightning.py
"""
import argparse

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def points(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(n, 16, generator=torch.Generator().manual_seed(seed))
    return x, x[:, :4].argmax(1)


class Cancelling(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("big", 200.0 * torch.randn(4, 16, generator=torch.Generator().manual_seed(3)))
        self.small = nn.Parameter(torch.zeros(4, 16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(x, self.big + self.small) - nn.functional.linear(x, self.big)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self(x).float(), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_acc", (self(x).argmax(1) == y).float().mean())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.5)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    L.seed_everything(args.seed)
    trainer = L.Trainer(max_epochs=2, accelerator="cpu", logger=False, enable_checkpointing=False)
    trainer.fit(Cancelling(), DataLoader(TensorDataset(*points(2048, 0)), batch_size=32, shuffle=True),
                DataLoader(TensorDataset(*points(512, 1)), batch_size=256))
    print("final", trainer.callback_metrics["val_acc"].item())
