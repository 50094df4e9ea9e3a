"""Hangs before its Trainer ever fits (waiting on a resource that never comes)."""
import time

import lightning as L
from _tiny import Net, loader

trainer = L.Trainer(max_epochs=1, accelerator="cpu")
time.sleep(3600)
trainer.fit(Net(), train_dataloaders=loader())
