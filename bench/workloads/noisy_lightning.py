"""A Lightning script of a small CNN with BatchNorm (``_noisy_images``), trained by Adam for
2 epochs with its validation accuracy logged each epoch: fp32's seeds end far apart.

    python bench/workloads/noisy_lightning.py [--seed S]
    autotune run bench/workloads/noisy_lightning.py
"""
import argparse
import sys
from pathlib import Path

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _noisy_images import cnn, images


class Net(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = cnn()

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.net(x).float(), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_acc", (self.net(x).argmax(dim=1) == y).float().mean(), prog_bar=True)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=3e-3)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()
    L.seed_everything(args.seed)
    train = DataLoader(TensorDataset(*images(1600, 0)), batch_size=args.batch_size, shuffle=True)
    val = DataLoader(TensorDataset(*images(400, 1)), batch_size=200)
    trainer = L.Trainer(max_epochs=2, accelerator="cpu", logger=False, enable_checkpointing=False)
    trainer.fit(Net(), train, val)
    print("final", trainer.callback_metrics["val_acc"].item())
