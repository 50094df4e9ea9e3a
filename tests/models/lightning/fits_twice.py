"""Fits twice: a warm-up run, then the real one."""
import lightning as L
from _tiny import Net, loader

trainer = L.Trainer(max_epochs=1, accelerator="cpu")
trainer.fit(Net(), train_dataloaders=loader())
trainer.fit(Net(), train_dataloaders=loader())
