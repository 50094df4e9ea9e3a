"""A Lightning script that builds its DataLoaders itself and passes them to ``fit`` (no
``batch_size`` attribute anywhere, so autotune keeps its batch and says what to add), written
against the ``pytorch_lightning`` package; synthetic sequences, no download.

    python examples/lightning_dataloaders.py             # trains it
    autotune run examples/lightning_dataloaders.py       # tunes it: the same script, measured inside fit
"""
import pytorch_lightning as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

SEQ = 32
VOCAB = 128


class Sequences(Dataset):
    """Each item a noisy ramp of tokens, made on request (as a data set that reads and
    decodes its items would): predict the next token."""

    def __init__(self, n: int, seed: int) -> None:
        self.n, self.seed = n, seed

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + i)
        start = int(torch.randint(0, VOCAB, (1,), generator=g))
        ids = (start + torch.arange(SEQ + 1)) % VOCAB
        noise = torch.rand(SEQ + 1, generator=g) < 0.1
        ids = torch.where(noise, torch.randint(0, VOCAB, (SEQ + 1,), generator=g), ids)
        return ids[:-1], ids[1:]


class NextToken(pl.LightningModule):
    def __init__(self, width: int = 256, lr: float = 2e-3) -> None:
        super().__init__()
        self.lr = lr
        self.embed = nn.Embedding(VOCAB, width)
        layer = nn.TransformerEncoderLayer(width, nhead=4, dim_feedforward=4 * width, batch_first=True)
        self.body = nn.TransformerEncoder(layer, num_layers=2)
        self.head = nn.Linear(width, VOCAB)

    def loss(self, batch):
        x, y = batch
        mask = nn.Transformer.generate_square_subsequent_mask(x.shape[1], device=x.device)
        logits = self.head(self.body(self.embed(x), mask=mask, is_causal=True))
        return nn.functional.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1))

    def training_step(self, batch, batch_idx):
        return self.loss(batch)

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", self.loss(batch))

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.lr)


def main() -> None:
    pl.seed_everything(0)
    train = DataLoader(Sequences(4096, 0), batch_size=32, shuffle=True)
    val = DataLoader(Sequences(256, 1), batch_size=64)
    trainer = pl.Trainer(max_epochs=1, accelerator="auto", logger=False, enable_checkpointing=False)
    trainer.fit(NextToken(), train_dataloaders=train, val_dataloaders=val)


if __name__ == "__main__":
    main()
