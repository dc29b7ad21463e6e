"""A small DDP training loop used by ``python -m ddpfaults demo`` and the quick-start."""

from __future__ import annotations

import torch
import torch.distributed as dist


def train(ctx, steps: int = 4):
    """Train a seeded 2-layer MLP with DDP for ``steps`` steps; all_reduce the loss for logging."""
    torch.manual_seed(ctx.seed)
    model = ctx.ddp(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(ctx.seed * 1000 + ctx.rank)
    for step in range(steps):
        ctx.step(step)
        x, y = torch.randn(4, 8, generator=generator), torch.randn(4, 1, generator=generator)
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        logged = loss.detach().clone()
        dist.all_reduce(logged)  # the logging collective one rank will skip in the demo
    return [p.detach().sum().item() for p in model.parameters()]
