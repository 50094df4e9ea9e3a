"""A Trainer script that waits forever before its training (a lock it never gets)."""
import time

from _tiny import Net, Pairs
from transformers import Trainer, TrainingArguments

trainer = Trainer(model=Net(), args=TrainingArguments(output_dir="out", report_to="none"), train_dataset=Pairs())
time.sleep(3600)
trainer.train()
