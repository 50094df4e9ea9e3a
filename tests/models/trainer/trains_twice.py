"""A Trainer script that trains, then trains again."""
from _tiny import Net, Pairs
from transformers import Trainer, TrainingArguments

trainer = Trainer(model=Net(), args=TrainingArguments(output_dir="out", report_to="none"), train_dataset=Pairs())
trainer.train()
trainer.train(resume_from_checkpoint=False)
