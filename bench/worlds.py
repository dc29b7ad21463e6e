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
    from ddpfaults.toy.models import MLP, regression_step

    model = ctx.ddp(MLP(seed=ctx.seed))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(steps):
        regression_step(ctx, model, optimizer, step)
    return sum(p.detach().sum().item() for p in model.parameters())
