"""A Lightning script with a DataModule that holds batch_size, a validation accuracy that a
ModelCheckpoint monitors, and items that take a while to make (``--seconds-per-sample``), so
that DataLoader workers are clearly faster. With --save-to FILE and --marker FILE it saves a
checkpoint and writes a file once its fit is over (in a ``finally``), as a user's script
does: no process autotune starts may run that part."""
import argparse
import pathlib
import time

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset


class Slow(Dataset):
    def __init__(self, n: int, seed: int, seconds: float) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 16, generator=g)
        self.y = (self.x[:, :8].sum(dim=1) > self.x[:, 8:].sum(dim=1)).long()
        self.seconds = seconds

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i):
        if self.seconds:
            time.sleep(self.seconds)
        return self.x[i], self.y[i]


class Data(L.LightningDataModule):
    def __init__(self, batch_size: int, seconds: float) -> None:
        super().__init__()
        self.batch_size, self.seconds = batch_size, seconds

    def setup(self, stage):
        self.train_set, self.val_set = Slow(2048, 0, self.seconds), Slow(256, 1, 0.0)

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.val_set, batch_size=128)


class Net(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 2))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_acc", (self.net(x).argmax(dim=1) == y).float().mean())

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-2)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seconds-per-sample", type=float, default=0.0)
    parser.add_argument("--save-to", default="")
    parser.add_argument("--marker", default="")
    args = parser.parse_args()
    L.seed_everything(0)
    trainer = L.Trainer(max_epochs=3, accelerator="cpu",
                        callbacks=[L.pytorch.callbacks.ModelCheckpoint(monitor="val_acc", mode="max")])
    try:
        trainer.fit(Net(), datamodule=Data(args.batch_size, args.seconds_per_sample))
    finally:  # as scripts do that keep what they trained even where the fit is cut short
        if args.save_to:
            trainer.save_checkpoint(args.save_to)
        if args.marker:
            pathlib.Path(args.marker).write_text("fitted\n")
