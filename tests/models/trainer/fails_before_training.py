"""A Trainer script whose data set cannot be read."""
from _tiny import Net
from transformers import Trainer, TrainingArguments


def load_data():
    raise FileNotFoundError("data/train.jsonl: no such file")


trainer = Trainer(model=Net(), args=TrainingArguments(output_dir="out", report_to="none"), train_dataset=load_data())
trainer.train()
