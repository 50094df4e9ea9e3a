"""A nanoGPT-style training script, written as a user would write it: a character-level
token tensor, ``get_batch()`` drawing random windows, a tiny GPT defined here, AdamW and a
plain ``for it in range(max_iters)`` loop with no DataLoader. Nothing in it knows about
autotune; it is the example that

    autotune run examples/loop_gpt.py -- --max_iters 300

tunes. The text is generated in code from a small fixed grammar (no download), so the
validation loss falls well below that of uniform guessing within a few hundred iterations.
It prints its own training throughput at every evaluation and saves nothing.
"""
import argparse
import random
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

WARMUP_ITERS = 5  # iterations at the start left out of the throughput
EVAL_ITERS = 20   # batches per validation-loss estimate


def make_text(n_sentences=12000, seed=1234):
    """Sentences from a tiny grammar: learnable spelling, word order and agreement."""
    rng = random.Random(seed)
    adjectives = ["old", "quiet", "red", "small", "clever", "tired", "bright", "strange"]
    nouns = ["fox", "ship", "miller", "river", "garden", "king", "lantern", "sailor"]
    verbs = ["sees", "follows", "remembers", "carries", "finds", "watches"]
    places = ["by the mill", "under the bridge", "at dawn", "in the rain", "near the sea"]
    sentences = []
    for _ in range(n_sentences):
        s = f"the {rng.choice(adjectives)} {rng.choice(nouns)} {rng.choice(verbs)} the {rng.choice(nouns)}"
        if rng.random() < 0.5:
            s += " " + rng.choice(places)
        sentences.append(s + ".")
    return "\n".join(sentences) + "\n"


class Block(nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        self.n_head = n_head
        self.ln1 = nn.LayerNorm(n_embd)
        self.qkv = nn.Linear(n_embd, 3 * n_embd)
        self.proj = nn.Linear(n_embd, n_embd)
        self.ln2 = nn.LayerNorm(n_embd)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd))

    def attn(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab_size, block_size, n_embd=128, n_head=4, n_layer=2):
        super().__init__()
        self.tok_emb = nn.Embedding(vocab_size, n_embd)
        self.pos_emb = nn.Embedding(block_size, n_embd)
        self.blocks = nn.Sequential(*[Block(n_embd, n_head) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab_size)

    def forward(self, idx, targets=None):
        T = idx.shape[1]
        x = self.tok_emb(idx) + self.pos_emb(torch.arange(T, device=idx.device))
        logits = self.lm_head(self.ln_f(self.blocks(x)))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--max_iters", type=int, default=300)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--block_size", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eval_interval", type=int, default=100)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    text = make_text()
    chars = sorted(set(text))
    stoi = {ch: i for i, ch in enumerate(chars)}
    data = torch.tensor([stoi[ch] for ch in text], dtype=torch.long)
    n = int(0.9 * len(data))
    splits = {"train": data[:n], "val": data[n:]}

    def get_batch(split):
        d = splits[split]
        ix = torch.randint(len(d) - args.block_size - 1, (args.batch_size,))
        x = torch.stack([d[i:i + args.block_size] for i in ix])
        y = torch.stack([d[i + 1:i + 1 + args.block_size] for i in ix])
        return x, y

    @torch.no_grad()
    def estimate_val_loss():
        model.eval()
        losses = [model(*get_batch("val"))[1].item() for _ in range(EVAL_ITERS)]
        model.train()
        return sum(losses) / len(losses)

    model = GPT(len(chars), args.block_size)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)

    samples, start = 0, None
    for it in range(args.max_iters):
        x, y = get_batch("train")
        logits, loss = model(x, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if it == WARMUP_ITERS - 1:  # the clock starts once the first 5 iterations are done
            start = time.perf_counter()
        elif start is not None:
            samples += len(x)

        if (it + 1) % args.eval_interval == 0 or it + 1 == args.max_iters:
            elapsed = time.perf_counter() - start if start is not None else 0.0
            rate = samples / elapsed if elapsed > 0 and samples else float("nan")
            print(f"iter {it + 1}: train samples/s {rate:.1f}", flush=True)
            print(f"val_loss {estimate_val_loss():.4f}", flush=True)
            if start is not None:  # time the next window afresh, leaving the evaluation out
                samples, start = 0, time.perf_counter()


if __name__ == "__main__":
    main()
