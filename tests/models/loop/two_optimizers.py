"""A GAN-style loop: two optimizers, each stepping its own model."""
import torch

generator = torch.nn.Linear(4, 4)
critic = torch.nn.Linear(4, 1)
g_opt = torch.optim.Adam(generator.parameters(), lr=1e-3)
c_opt = torch.optim.Adam(critic.parameters(), lr=1e-3)
for _ in range(1000):
    z = torch.randn(16, 4)
    c_loss = critic(generator(z).detach()).mean() - critic(torch.randn(16, 4)).mean()
    c_opt.zero_grad()
    c_loss.backward()
    c_opt.step()
    g_loss = -critic(generator(z)).mean()
    g_opt.zero_grad()
    g_loss.backward()
    g_opt.step()
