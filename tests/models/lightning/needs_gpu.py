"""Pins its Trainer to a GPU."""
import lightning as L
from _tiny import Net, loader

trainer = L.Trainer(max_epochs=1, accelerator="gpu", devices=1)
trainer.fit(Net(), train_dataloaders=loader())
