"""Rank functions used by the benchmarks (module level, so they pickle by reference)."""

import torch
import torch.distributed as dist


def one_all_reduce(ctx):
    """Init (done by the engine) + one all_reduce."""
    t = torch.ones(1)
    dist.all_reduce(t)
    return float(t)


def steps_of_all_reduce(ctx, steps=4):
    """One all_reduce per step."""
    t = torch.ones(1)
    for step in range(steps):
        ctx.step(step)
        dist.all_reduce(t)
    return float(t)


def ddp_steps(ctx, steps=3):
    """A few DDP steps of the tiny MLP (the non-detection toy model)."""
    from ddpfaults.models import MLP

    model = ctx.ddp(MLP(seed=ctx.seed))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(ctx.seed * 1000 + ctx.rank)
    for step in range(steps):
        ctx.step(step)
        x, y = torch.randn(8, 8, generator=generator), torch.randn(8, 2, generator=generator)
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return sum(p.detach().sum().item() for p in model.parameters())
