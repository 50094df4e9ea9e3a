"""A Hugging Face Trainer script as its user runs it: a small GPT-2 built from its config (no
download), synthetic token sequences, TrainingArguments in code, an evaluation set.

    python examples/hf_trainer.py              # trains it
    autotune run examples/hf_trainer.py        # tunes it: the same script, measured in its Trainer
"""
import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

SEQ = 64
VOCAB = 256


class Tokens(torch.utils.data.Dataset):
    """Sequences of a repeating pattern with noise: a language model can learn them."""

    def __init__(self, n: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        base = torch.arange(SEQ) % 17
        noise = torch.randint(0, VOCAB, (n, SEQ), generator=g)
        keep = torch.rand(n, SEQ, generator=g) < 0.8
        self.ids = torch.where(keep, (base + torch.randint(0, 8, (n, 1), generator=g)) % VOCAB, noise)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def small_gpt2() -> GPT2LMHeadModel:
    return GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=128, n_layer=2, n_head=4))


def main() -> None:
    model = small_gpt2()
    args = TrainingArguments(
        output_dir="hf-trainer-out",
        per_device_train_batch_size=8,
        num_train_epochs=1,
        learning_rate=1e-3,
        logging_steps=50,
        eval_strategy="epoch",
        save_strategy="no",
        report_to="none",
        seed=0,
    )
    trainer = Trainer(model=model, args=args, train_dataset=Tokens(2048, 0), eval_dataset=Tokens(128, 1))
    trainer.train()
    print(trainer.evaluate())


if __name__ == "__main__":
    main()
