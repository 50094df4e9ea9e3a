"""Asks its Trainer for two CPU processes (Lightning would start the second as the bare script)."""
import lightning as L
from _tiny import Net, loader

if __name__ == "__main__":
    trainer = L.Trainer(max_epochs=1, accelerator="cpu", devices=2, strategy="ddp")
    trainer.fit(Net(), train_dataloaders=loader())
