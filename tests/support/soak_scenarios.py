"""A tiny scenario module for the soak command's tests: one case that completes, one that crashes on rank 1.

Not named ``scenario_*.py`` so the plugin does not collect it; tests pass its path explicitly. The timeout is
generous because a world's timeout also covers a cold fork server's start, which CPU hogs slow down.
"""

import torch
import torch.distributed as dist

import ddpfaults
from ddpfaults.faults import RankCrash


@ddpfaults.scenario(
    world_size=2,
    # fixed: the guard's 600 s (EVENT_GUARD; tests/support is not importable in this session): no verdict depends on it
    timeout=240,
    variants=[
        ddpfaults.variant("clean", expect="completed"),
        ddpfaults.variant("crash", faults=[RankCrash(rank=1, step=1)], expect="crashed with RuntimeError on rank 1"),
    ],
)
def reduce_steps(ctx, steps: int = 3):
    """Every step all-reduces a tensor."""
    t = torch.ones(1)
    for step in range(steps):
        ctx.step(step)
        dist.all_reduce(t)
    return float(t)
