"""Raises while reading its data, before fit."""
import lightning as L
from _tiny import Net


def load_data(path):
    raise FileNotFoundError(f"{path}: no such file")


trainer = L.Trainer(max_epochs=1, accelerator="cpu")
trainer.fit(Net(), train_dataloaders=load_data("data/train.pt"))
