"""The training of hf_trainer.py, its TrainingArguments parsed from the command line by
HfArgumentParser, as many Hugging Face scripts take them:

    python examples/hf_trainer_parsed.py --output_dir out --per_device_train_batch_size 8
    autotune run examples/hf_trainer_parsed.py -- --output_dir out --per_device_train_batch_size 8
"""
from hf_trainer import Tokens, small_gpt2
from transformers import HfArgumentParser, Trainer, TrainingArguments


def main() -> None:
    (args,) = HfArgumentParser(TrainingArguments).parse_args_into_dataclasses()
    trainer = Trainer(model=small_gpt2(), args=args, train_dataset=Tokens(2048, 0), eval_dataset=Tokens(128, 1))
    trainer.train()


if __name__ == "__main__":
    main()
