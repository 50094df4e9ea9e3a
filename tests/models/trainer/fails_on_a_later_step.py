"""A Trainer script whose model raises on its 7th training step: past the check's two steps."""
import torch
from _tiny import Net, Pairs
from transformers import Trainer, TrainingArguments


class Breaks(Net):
    calls = 0

    def forward(self, x, labels=None):
        Breaks.calls += 1
        if Breaks.calls == 7:
            raise RuntimeError("the labels ran out")
        return super().forward(x, labels)


trainer = Trainer(model=Breaks(), args=TrainingArguments(output_dir="out", report_to="none", max_steps=50),
                  train_dataset=Pairs())
trainer.train()
torch.save({}, "never-written.pt")
