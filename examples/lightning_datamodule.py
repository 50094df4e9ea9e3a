"""A Lightning script as its user runs it: a LightningModule, a LightningDataModule that holds
its ``batch_size``, a validation accuracy that a ModelCheckpoint monitors, synthetic data (no
download).

    python examples/lightning_datamodule.py              # trains it
    autotune run examples/lightning_datamodule.py        # tunes it: the same script, measured inside fit
"""
import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

FEATURES = 256
CLASSES = 10


def teacher_data(n: int, seed: int) -> TensorDataset:
    """Inputs labelled by a fixed random network: a classifier can learn them."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, FEATURES, generator=g)
    teacher = torch.randn(FEATURES, CLASSES, generator=torch.Generator().manual_seed(1234))
    y = (torch.tanh(x) @ teacher).argmax(dim=1)
    return TensorDataset(x, y)


class Data(L.LightningDataModule):
    def __init__(self, batch_size: int = 64) -> None:
        super().__init__()
        self.batch_size = batch_size

    def setup(self, stage: str) -> None:
        self.train_set, self.val_set = teacher_data(8192, 0), teacher_data(1024, 1)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=256)


class Classifier(L.LightningModule):
    def __init__(self, hidden: int = 1024, lr: float = 1e-3) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(FEATURES, hidden), nn.GELU(), nn.Linear(hidden, hidden), nn.GELU(),
                                 nn.Linear(hidden, hidden), nn.GELU(), nn.Linear(hidden, CLASSES))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self.net(x)
        self.log("val_loss", nn.functional.cross_entropy(logits, y))
        self.log("val_acc", (logits.argmax(dim=1) == y).float().mean())

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)


def main() -> None:
    L.seed_everything(0)
    trainer = L.Trainer(
        max_epochs=2,
        accelerator="cpu",
        callbacks=[L.pytorch.callbacks.ModelCheckpoint(monitor="val_acc", mode="max")],
        default_root_dir="lightning-out",
    )
    trainer.fit(Classifier(), datamodule=Data(batch_size=64))


if __name__ == "__main__":
    main()
