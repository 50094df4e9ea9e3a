"""A Trainer script whose TrainingArguments come from the command line (HfArgumentParser).

With --seconds_per_sample S its data set and its model each sleep S a sample, as
tests/models/slow_loading.py does: DataLoader workers then overlap loading with training and
are clearly faster on any CPU, beside any load. With --save_to DIR and --marker FILE it saves
its model and writes a file once its training is over, as a user's script does: no process
autotune starts may run that part."""
import dataclasses
import pathlib
import time

import torch
from transformers import HfArgumentParser, Trainer, TrainingArguments


@dataclasses.dataclass
class DataArguments:
    samples: int = 512
    seconds_per_sample: float = 0.0
    save_to: str = ""
    marker: str = ""


SLEEP = [0.0]


class Pairs(torch.utils.data.Dataset):
    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 32, generator=g)
        self.y = (self.x[:, :4].sum(1) > 0).long()

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict:
        if SLEEP[0]:
            time.sleep(SLEEP[0])
        return {"x": self.x[i], "labels": self.y[i]}


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(32, 256), torch.nn.ReLU(), torch.nn.Linear(256, 2))

    def forward(self, x, labels=None):
        if SLEEP[0]:
            time.sleep(x.shape[0] * SLEEP[0])
        logits = self.body(x)
        loss = torch.nn.functional.cross_entropy(logits, labels)
        return {"loss": loss, "logits": logits}


def main() -> None:
    data_args, args = HfArgumentParser((DataArguments, TrainingArguments)).parse_args_into_dataclasses()
    SLEEP[0] = data_args.seconds_per_sample
    trainer = Trainer(model=Net(), args=args, train_dataset=Pairs(data_args.samples))
    trainer.train()
    if data_args.save_to:
        trainer.save_model(data_args.save_to)
    if data_args.marker:
        pathlib.Path(data_args.marker).write_text("trained\n")


if __name__ == "__main__":
    main()
