"""A Lightning script whose Trainer and batch come from its command line, and which prints its
own training rate when its fit ends (samples per second after its first 5 steps, all ranks'
samples, on rank 0): for the ranks benchmark, launched as written and as autotune's answer
says with no code of autotune's.

    python bench/workloads/lightning_ranks.py --max-steps 200
    OMP_NUM_THREADS=1 torchrun --nproc-per-node 2 bench/workloads/lightning_ranks.py --max-steps 200 \\
        --devices 2 --strategy ddp --batch-size 32
"""
import argparse
import time

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

FEATURES, CLASSES, WARM = 128, 10, 5


def teacher_data(n: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, FEATURES, generator=g)
    teacher = torch.randn(FEATURES, CLASSES, generator=torch.Generator().manual_seed(1234))
    return TensorDataset(x, (torch.tanh(x) @ teacher).argmax(dim=1))


class Data(L.LightningDataModule):
    def __init__(self, batch_size: int) -> None:
        super().__init__()
        self.batch_size = batch_size

    def setup(self, stage: str) -> None:
        self.train_set, self.val_set = teacher_data(16384, 0), teacher_data(1024, 1)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=256)


class Classifier(L.LightningModule):
    def __init__(self, hidden: int = 512) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(FEATURES, hidden), nn.GELU(), nn.Linear(hidden, hidden), nn.GELU(),
                                 nn.Linear(hidden, CLASSES))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_acc", (self.net(x).argmax(dim=1) == y).float().mean(), sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


class Rate(L.Callback):
    """The user's own timing: samples per second over the steps after the first WARM."""

    start = None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == WARM:
            self.start, self.first = time.perf_counter(), trainer.global_step

    def on_train_end(self, trainer, pl_module):
        if self.start is None or not trainer.is_global_zero:
            return
        samples = (trainer.global_step - self.first) * trainer.datamodule.batch_size * trainer.world_size
        print(f"training rate: {samples / (time.perf_counter() - self.start):.1f} samples/s", flush=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--max-steps", type=int, default=-1)
    p.add_argument("--devices", type=int, default=1)
    p.add_argument("--strategy", default="auto")
    p.add_argument("--batch-size", type=int, default=64)
    args = p.parse_args()
    L.seed_everything(0)
    trainer = L.Trainer(max_epochs=3, max_steps=args.max_steps, accelerator="cpu", devices=args.devices,
                        strategy=args.strategy, callbacks=[Rate()], enable_checkpointing=False, logger=False,
                        enable_progress_bar=False, default_root_dir="lightning-ranks-out")
    trainer.fit(Classifier(), datamodule=Data(args.batch_size))


if __name__ == "__main__":
    main()
