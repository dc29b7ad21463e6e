"""Rank functions set up by ``init_device_mesh`` (tests/engine/test_mesh_worlds.py)."""

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh


def mesh_only(ctx, steps=3):
    """``init_device_mesh`` over every rank, then one all_reduce over the mesh's group per step; the value."""
    mesh = init_device_mesh("cpu", (ctx.world_size,))
    t = torch.ones(1)
    for step in range(steps):
        ctx.step(step)
        dist.all_reduce(t, group=mesh.get_group())
    return float(t)
