"""GPT-2 small (124M parameters: 12 layers, 12 heads, width 768, sequence 1,024) in plain
PyTorch with ``scaled_dot_product_attention``, trained on generated tokens. For a GPU: on a
CPU one step of the user's batch takes tens of seconds.

The vocabulary is GPT-2's 50,257 rounded up to 50,304 (a multiple of 64), as nanoGPT does:
the output head's matrix product then tiles evenly. The tokens follow a fixed random bigram
table (each token has four possible successors), so the loss falls from ln(50304) ~ 10.8
towards ln(4) ~ 1.4 as the model learns it. ``evaluate`` returns the negated held-out loss
(autotune takes higher as better).

    autotune run bench/workloads/gpt2_small.py --trials 8
"""
from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

VOCAB, LENGTH, WIDTH, LAYERS, HEADS = 50_304, 1_024, 768, 12, 12
SUCCESSORS = 4
ITEMS = 4_096
batch_size = 8  # what a user with one GPU would start with


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(WIDTH)
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH)
        self.proj = nn.Linear(WIDTH, WIDTH)
        self.ln_2 = nn.LayerNorm(WIDTH)
        self.fc = nn.Linear(WIDTH, 4 * WIDTH)
        self.fc_proj = nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln_1(x)).split(WIDTH, dim=2)
        q, k, v = (z.view(b, t, HEADS, c // HEADS).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).contiguous().view(b, t, c))
        return x + self.fc_proj(F.gelu(self.fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wte = nn.Embedding(VOCAB, WIDTH)
        self.wpe = nn.Embedding(LENGTH, WIDTH)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.ln_f = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)
        self.head.weight = self.wte.weight  # tied, as in GPT-2
        self.apply(self._init)
        for block in self.blocks:  # GPT-2's scaled init of the residual projections
            for proj in (block.proj, block.fc_proj):
                nn.init.normal_(proj.weight, std=0.02 / math.sqrt(2 * LAYERS))

    @staticmethod
    def _init(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, std=0.02)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.wte(tokens) + self.wpe(positions)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def _table() -> torch.Tensor:
    return torch.randint(0, VOCAB, (VOCAB, SUCCESSORS), generator=torch.Generator().manual_seed(0))


class Tokens(torch.utils.data.Dataset):
    """Token sequences drawn from the bigram table, made once (vectorised over the sequences,
    a second or so) and held as int32, as a tokenised corpus in memory would be: an item is
    a slice, as cheap as a user's memory-mapped data set."""

    def __init__(self, n: int = ITEMS, seed: int = 1) -> None:
        g = torch.Generator().manual_seed(seed)
        table = _table()
        seqs = torch.empty(n, LENGTH + 1, dtype=torch.long)
        seqs[:, 0] = torch.randint(0, VOCAB, (n,), generator=g)
        picks = torch.randint(0, SUCCESSORS, (n, LENGTH), generator=g)
        for t in range(LENGTH):
            seqs[:, t + 1] = table[seqs[:, t], picks[:, t]]
        self.seqs = seqs.to(torch.int32)

    def __len__(self) -> int:
        return len(self.seqs)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        seq = self.seqs[i].long()
        return seq[:-1], seq[1:]


def build_model() -> nn.Module:
    return GPT()


def build_dataset() -> torch.utils.data.Dataset:
    return Tokens()


def build_optimizer(params) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1)


def training_step(model: nn.Module, batch) -> torch.Tensor:
    tokens, targets = batch
    logits = model(tokens)
    return F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))


def evaluate(model: nn.Module) -> float:
    """The negated mean loss on 8 held-out sequences (higher is better)."""
    held = Tokens(n=8, seed=2).seqs.long()
    tokens, targets = held[:, :-1], held[:, 1:]
    device = next(model.parameters()).device
    model.eval()
    with torch.no_grad():
        logits = model(tokens.to(device))
        loss = F.cross_entropy(logits.reshape(-1, VOCAB).float(), targets.to(device).reshape(-1))
    model.train()
    return -float(loss)
