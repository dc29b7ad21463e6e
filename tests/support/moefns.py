"""MoE-style ``all_to_all_single`` rank functions (tests/engine/test_moe_worlds.py)."""

import torch
import torch.distributed as dist


def even_receivers(ctx, sender=1, steps=3):
    """Each rank routes 2 tokens to every rank's expert and receives an even split (no ``output_split_sizes``: the
    counts are never exchanged); at step 1 rank ``sender`` routes 4 more to expert ``sender + 1``: 12 tokens where
    the others send 8, rows its receiver's buffer has no room for."""
    n = ctx.world_size
    for step in range(steps):
        ctx.step(step)
        rows_out = [2] * n
        if ctx.rank == sender and step == 1:
            rows_out[(sender + 1) % n] += 4
        out = torch.empty(2 * n, 4)
        dist.all_to_all_single(out, torch.ones(sum(rows_out), 4), input_split_sizes=rows_out)
    return 0
