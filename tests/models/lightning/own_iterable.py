"""Trains on an iterable of its own (batches from a generator), not a torch DataLoader."""
import lightning as L
import torch
from _tiny import Net


class Batches:
    def __iter__(self):
        g = torch.Generator().manual_seed(0)
        for _ in range(16):
            x = torch.randn(8, 8, generator=g)
            yield x, (x.sum(dim=1) > 0).long()


class Data(L.LightningDataModule):
    batch_size = 8

    def train_dataloader(self):
        return Batches()


trainer = L.Trainer(max_epochs=1, accelerator="cpu")
trainer.fit(Net(), datamodule=Data())
