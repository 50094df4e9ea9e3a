"""A Trainer script that builds its Trainer but trains only when told to."""
import os

from _tiny import Net, Pairs
from transformers import Trainer, TrainingArguments

trainer = Trainer(model=Net(), args=TrainingArguments(output_dir="out", report_to="none"), train_dataset=Pairs())
if os.environ.get("REALLY_TRAIN"):
    trainer.train()
