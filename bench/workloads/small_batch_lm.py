"""A small transformer language model trained at batch 4 on short generated sequences, as
a fine-tuning script with a small batch is: each step is too small to keep the cores busy,
so throughput rises with the batch where the user lets it (--batch-range). No evaluate():
the batch stays the user's unless a range is given."""
import torch
from torch import nn

batch_size = 4
VOCAB, LENGTH, WIDTH = 512, 32, 64


class SmallLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.pos = nn.Parameter(torch.zeros(LENGTH, WIDTH))
        layer = nn.TransformerEncoderLayer(WIDTH, 4, 2 * WIDTH, dropout=0.0, batch_first=True)
        self.body = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(WIDTH, VOCAB)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(LENGTH))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens) + self.pos[: tokens.shape[1]]
        return self.head(self.body(h, mask=self.mask, is_causal=True))


class Tokens(torch.utils.data.Dataset):
    """Sequences from a fixed random bigram table (four successors a token)."""

    def __init__(self, n: int = 8_192) -> None:
        g = torch.Generator().manual_seed(0)
        table = torch.randint(0, VOCAB, (VOCAB, 4), generator=g)
        seqs = torch.empty(n, LENGTH + 1, dtype=torch.long)
        seqs[:, 0] = torch.randint(0, VOCAB, (n,), generator=g)
        picks = torch.randint(0, 4, (n, LENGTH), generator=g)
        for t in range(LENGTH):
            seqs[:, t + 1] = table[seqs[:, t], picks[:, t]]
        self.seqs = seqs

    def __len__(self) -> int:
        return len(self.seqs)

    def __getitem__(self, i: int):
        s = self.seqs[i]
        return s[:-1], s[1:]


def build_model() -> nn.Module:
    return SmallLM()


def build_dataset():
    return Tokens()


def training_step(model, batch):
    tokens, targets = batch
    logits = model(tokens)
    return nn.functional.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))
