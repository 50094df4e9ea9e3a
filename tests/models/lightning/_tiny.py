"""What the Lightning fault scripts beside it share: a small module and data set."""
import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset


def pairs(n: int = 64) -> TensorDataset:
    x = torch.randn(n, 8, generator=torch.Generator().manual_seed(0))
    return TensorDataset(x, (x.sum(dim=1) > 0).long())


class Net(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 2)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.fc(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def loader() -> DataLoader:
    return DataLoader(pairs(), batch_size=8)
