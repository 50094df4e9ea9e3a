"""A causal language model from Hugging Face transformers (GPT-2's architecture, small and
with random weights: nothing is downloaded), trained on generated token sequences.

It shows a model with its own calling convention: batches are dicts, and the model
computes its own loss (``training_step`` returns ``model(**batch).loss``). Needs the
transformers package: ``pip install 'autotune[examples]'``.

    autotune run examples/tiny_gpt.py --trials 8
"""
import torch

try:
    from transformers import GPT2Config, GPT2LMHeadModel
except ImportError as exc:  # the contract check shows this message as it is
    raise ImportError("examples/tiny_gpt.py needs the transformers package: "
                      "pip install 'autotune[examples]' (or pip install transformers)") from exc

VOCAB = 512
SEQUENCE = 64
ITEMS = 4096
batch_size = 16  # what a user would start with


class Sequences(torch.utils.data.Dataset):
    """Each sequence counts up from a random start with a random stride (mod VOCAB), so the
    next token is predictable from the two before it and the loss falls as the model learns."""

    def __init__(self, n: int = ITEMS, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        start = torch.randint(0, VOCAB, (n, 1), generator=g)
        stride = torch.randint(1, 8, (n, 1), generator=g)
        self.tokens = (start + stride * torch.arange(SEQUENCE)) % VOCAB

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, i: int) -> dict:
        ids = self.tokens[i]
        return {"input_ids": ids, "labels": ids}  # the model shifts the labels itself


def build_model() -> torch.nn.Module:
    config = GPT2Config(vocab_size=VOCAB, n_positions=SEQUENCE, n_embd=128, n_layer=2, n_head=4,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
                        loss_type="ForCausalLM")
    return GPT2LMHeadModel(config)


def build_dataset() -> torch.utils.data.Dataset:
    return Sequences()


def build_optimizer(params) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=1e-3)


def training_step(model: torch.nn.Module, batch: dict) -> torch.Tensor:
    return model(**batch).loss


def evaluate(model: torch.nn.Module) -> float:
    """Next-token accuracy on held-out sequences (higher is better)."""
    # The model comes on its training device (a GPU in a CUDA run): the tokens go there too.
    held_out = Sequences(n=256, seed=1).tokens.to(next(model.parameters()).device)
    model.eval()
    with torch.no_grad():
        logits = model(input_ids=held_out).logits
    model.train()
    predicted = logits[:, 1:-1].argmax(-1)
    return (predicted == held_out[:, 2:]).float().mean().item()
