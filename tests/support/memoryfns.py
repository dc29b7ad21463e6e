"""Rank functions for the OutOfMemory and link fault tests (module level: ranks import them by reference)."""

import torch
import torch.distributed as dist

#: more than OutOfMemory's 32 MiB margin; allocated, never touched
LARGE = 64 * 2**20


def allocate_each_step(ctx, steps=3, catch=False):
    """Each step allocate LARGE bytes, then all_reduce; ``catch``: note an out-of-memory error and go on.
    Returns, per step, whether this rank's allocation succeeded."""
    allocated = []
    t = torch.ones(1)
    for step in range(steps):
        ctx.step(step)
        try:
            torch.empty(LARGE // 4)
            allocated.append(True)
        except RuntimeError as exc:
            if not catch or "can't allocate memory" not in str(exc):
                raise
            allocated.append(False)
        dist.all_reduce(t)
    return allocated
