"""A small causal transformer over long sequences, written by hand as many are (its
attention builds the full sequence-by-sequence score matrix): at its batch size its
activations, not its weights, take most of the memory a step holds.

It shows what autotune does when memory binds: under a limit it does not fit in at its
own batch, activation checkpointing (the repeated ``Block``s recompute their activations
in the backward pass) or gradient accumulation keep the batch within it:

    autotune run examples/long_sequences.py --fix batch_size=32 --memory-limit 900MiB
"""
import math

import torch

VOCAB = 256
SEQUENCE = 512
WIDTH = 32
HEADS = 2
LAYERS = 4
ITEMS = 2048
batch_size = 16  # what a user would start with


class Counting(torch.utils.data.Dataset):
    """Each sequence counts up from a random start with a random stride (mod VOCAB): the
    next token follows from the two before it, so the loss falls as the model learns."""

    def __init__(self, n: int = ITEMS, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        start = torch.randint(0, VOCAB, (n, 1), generator=g)
        stride = torch.randint(1, 8, (n, 1), generator=g)
        self.tokens = (start + stride * torch.arange(SEQUENCE + 1)) % VOCAB

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, i: int):
        return self.tokens[i, :-1], self.tokens[i, 1:]


class Block(torch.nn.Module):
    """Pre-norm causal self-attention and an MLP, each added back to its input."""

    def __init__(self) -> None:
        super().__init__()
        self.norm1, self.norm2 = torch.nn.LayerNorm(WIDTH), torch.nn.LayerNorm(WIDTH)
        self.qkv = torch.nn.Linear(WIDTH, 3 * WIDTH)
        self.out = torch.nn.Linear(WIDTH, WIDTH)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(WIDTH, 4 * WIDTH), torch.nn.GELU(),
                                       torch.nn.Linear(4 * WIDTH, WIDTH))
        self.register_buffer("causal", torch.ones(SEQUENCE, SEQUENCE, dtype=torch.bool).tril(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = (t.view(b, s, HEADS, WIDTH // HEADS).transpose(1, 2)
                   for t in self.qkv(self.norm1(x)).chunk(3, dim=-1))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(WIDTH // HEADS)
        scores = scores.masked_fill(~self.causal[:s, :s], float("-inf"))
        attended = (scores.softmax(dim=-1) @ v).transpose(1, 2).reshape(b, s, WIDTH)
        x = x + self.out(attended)
        return x + self.mlp(self.norm2(x))


class Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, WIDTH)
        self.position = torch.nn.Parameter(torch.zeros(SEQUENCE, WIDTH))
        self.blocks = torch.nn.Sequential(*(Block() for _ in range(LAYERS)))
        self.norm = torch.nn.LayerNorm(WIDTH)
        self.head = torch.nn.Linear(WIDTH, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.position[: tokens.shape[1]]
        return self.head(self.norm(self.blocks(x)))


def build_model() -> torch.nn.Module:
    return Model()


def build_dataset() -> torch.utils.data.Dataset:
    return Counting()


def build_optimizer(params) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=1e-3)


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())


def evaluate(model: torch.nn.Module) -> float:
    """Next-token accuracy on held-out sequences (higher is better)."""
    held_out = Counting(n=64, seed=1)
    inputs, targets = held_out.tokens[:, :-1], held_out.tokens[:, 1:]
    device = next(model.parameters()).device
    model.eval()
    with torch.no_grad():
        predicted = model(inputs.to(device)).argmax(-1)
    model.train()
    # the first two tokens of a sequence do not yet show its stride
    return (predicted[:, 2:] == targets[:, 2:].to(device)).float().mean().item()
