"""A Hugging Face Trainer script of a small CNN with BatchNorm (``_noisy_images``), trained by
the Trainer's AdamW for 2 epochs and evaluated each epoch (accuracy): fp32's seeds end far
apart. Its arguments are parsed from the command line:

    python bench/workloads/noisy_trainer.py --output_dir out
    autotune run bench/workloads/noisy_trainer.py -- --output_dir out
"""
import sys
from pathlib import Path

import numpy as np
import torch
from transformers import HfArgumentParser, Trainer, TrainingArguments, set_seed

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _noisy_images import cnn, images


class Images(torch.utils.data.Dataset):
    def __init__(self, n: int, seed: int) -> None:
        self.x, self.y = images(n, seed)

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"pixels": self.x[i], "labels": self.y[i]}


class Classifier(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = cnn()

    def forward(self, pixels: torch.Tensor, labels: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        logits = self.net(pixels)
        out = {"logits": logits}
        if labels is not None:
            out["loss"] = torch.nn.functional.cross_entropy(logits.float(), labels)
        return out


def accuracy(pred) -> dict[str, float]:
    return {"accuracy": float((np.argmax(pred.predictions, axis=1) == pred.label_ids).mean())}


def main() -> None:
    parser = HfArgumentParser(TrainingArguments)
    defaults = ["--num_train_epochs", "2", "--per_device_train_batch_size", "32", "--learning_rate", "3e-3",
                "--eval_strategy", "epoch", "--metric_for_best_model", "accuracy", "--save_strategy", "no",
                "--report_to", "none", "--use_cpu", "--seed", "0", "--logging_steps", "1000"]
    (args,) = parser.parse_args_into_dataclasses(defaults + sys.argv[1:])
    set_seed(args.seed)  # the model's weights come from the run's seed
    trainer = Trainer(model=Classifier(), args=args, train_dataset=Images(1600, 0), eval_dataset=Images(400, 1),
                      compute_metrics=accuracy)
    trainer.train()
    print("final", trainer.evaluate()["eval_accuracy"])


if __name__ == "__main__":
    main()
