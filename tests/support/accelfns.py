"""Rank functions that train through Hugging Face Accelerate (``tests/engine/test_accelerate_worlds.py``); accelerate
is imported inside each (by the script they run), so this module imports without it."""

import os
import runpy

import torch.distributed as dist

LOOP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "accelerate_loop.py")


def accelerate_loop(ctx, batches=5, empty_rank=None, empty_batch=None):
    """``scripts/accelerate_loop.py``'s :func:`train` as a rank function (``ctx.step`` announcing its batches), on
    the world's process group; returns the world size."""
    # accelerate reads the world from torchrun's variables; it then takes the process group already made
    world = {"RANK": ctx.rank, "LOCAL_RANK": ctx.rank, "WORLD_SIZE": ctx.world_size, "LOCAL_WORLD_SIZE": ctx.world_size}
    os.environ.update({k: str(v) for k, v in world.items()})
    runpy.run_path(LOOP)["train"](batches, empty_rank, empty_batch, announce=ctx.step)
    return dist.get_world_size()
