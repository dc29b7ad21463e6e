"""Rank functions written for GPUs, run with ``cuda_on_cpu`` (tests/engine/test_cuda_on_cpu_worlds.py)."""

import torch
from torch.nn.parallel import DistributedDataParallel


def gpu_steps(ctx, steps=4):
    """DDP on "cuda:RANK" for ``steps`` steps; returns where the parameters are and how many GPUs the rank saw."""
    torch.cuda.set_device(ctx.rank)
    model = DistributedDataParallel(torch.nn.Linear(4, 1).cuda(), device_ids=[ctx.rank])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(steps):
        ctx.step(step)
        model(torch.randn(2, 4, device="cuda")).sum().backward()
        optimizer.step()
    return str(next(model.parameters()).device), torch.cuda.device_count()
