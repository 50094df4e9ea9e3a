"""Builds a Trainer and returns without fitting it (fit behind a flag it was not given)."""
import sys

import lightning as L
from _tiny import Net, loader

trainer = L.Trainer(max_epochs=1, accelerator="cpu")
if "--train" in sys.argv:
    trainer.fit(Net(), train_dataloaders=loader())
