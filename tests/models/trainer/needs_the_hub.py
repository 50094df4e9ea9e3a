"""A Trainer script whose model comes from the Hugging Face Hub, and is not on this machine."""
from _tiny import Pairs
from transformers import AutoModelForSequenceClassification, Trainer, TrainingArguments

model = AutoModelForSequenceClassification.from_pretrained("autotune-tests/not-on-this-machine")
trainer = Trainer(model=model, args=TrainingArguments(output_dir="out", report_to="none"), train_dataset=Pairs())
trainer.train()
