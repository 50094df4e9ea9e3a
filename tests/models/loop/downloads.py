"""A loop whose data set is downloaded when the script starts (the check downloads nothing)."""
import urllib.request

import torch


def load_data():
    with urllib.request.urlopen("https://data.invalid/train.pt", timeout=5) as f:
        return torch.load(f)


data = load_data()
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for x in data:
    loss = model(x).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
