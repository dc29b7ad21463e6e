"""A rank raises mid-training: gloo peers get "Connection closed by peer" (exit); NCCL-like peers hang (linger)."""

import torch
import torch.distributed as dist

import ddpfaults
from _checks import HANG_STALL, SAFE_STALL
from ddpfaults.faults import RankCrash

CRASH = RankCrash(rank=1, step=2, exc=KeyError("segment_mask"))


@ddpfaults.scenario(
    world_size=4,
    faults=[CRASH],
    stall=SAFE_STALL,
    variants=[
        ddpfaults.variant("exit", peer_failure="exit", expect="crashed with KeyError on rank 1"),
        ddpfaults.variant("linger", peer_failure="linger", stall=HANG_STALL, expect="hung with KeyError on rank 1"),
    ],
)
def rank_crash(ctx, steps: int = 4):
    """Every step all-reduces a tensor; rank 1 raises KeyError at step 2."""
    t = torch.ones(1)
    for step in range(steps):
        ctx.step(step)
        dist.all_reduce(t)
    return float(t)
