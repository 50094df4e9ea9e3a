"""A small transformer language model with its own calling convention (training_step)
on generated token sequences."""
import torch
from torch import nn

batch_size = 32
VOCAB, LENGTH = 1_000, 64


class TinyLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 128)
        self.pos = nn.Parameter(torch.zeros(LENGTH, 128))
        layer = nn.TransformerEncoderLayer(128, 4, 256, dropout=0.0, batch_first=True)
        self.body = nn.TransformerEncoder(layer, 2)
        self.head = nn.Linear(128, VOCAB)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(LENGTH))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens) + self.pos[: tokens.shape[1]]
        return self.head(self.body(h, mask=self.mask[: tokens.shape[1], : tokens.shape[1]],
                                   is_causal=True))


class Tokens(torch.utils.data.Dataset):
    """Sequences from a fixed random bigram table, so there is something to learn."""

    def __init__(self, n: int = 4_096) -> None:
        g = torch.Generator().manual_seed(0)
        table = torch.randint(0, VOCAB, (VOCAB, 4), generator=g)
        seqs = torch.empty(n, LENGTH + 1, dtype=torch.long)
        seqs[:, 0] = torch.randint(0, VOCAB, (n,), generator=g)
        for t in range(LENGTH):
            pick = torch.randint(0, 4, (n,), generator=g)
            seqs[:, t + 1] = table[seqs[:, t], pick]
        self.seqs = seqs

    def __len__(self) -> int:
        return len(self.seqs)

    def __getitem__(self, i: int):
        s = self.seqs[i]
        return s[:-1], s[1:]


def build_model() -> nn.Module:
    return TinyLM()


def build_dataset():
    return Tokens()


def training_step(model, batch):
    tokens, targets = batch
    logits = model(tokens)
    return nn.functional.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))
