"""A loop that never reaches its optimizer's step (it waits for data that never comes)."""
import time

import torch

model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
while True:
    time.sleep(0.5)  # stands in for a queue that is never filled
    loss = model(torch.randn(8, 4)).pow(2).mean()
    if False:
        loss.backward()
        optimizer.step()
