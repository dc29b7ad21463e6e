"""Rank functions that train through Hugging Face Accelerate (``tests/engine/test_accelerate_worlds.py``); accelerate
is imported inside each, so this module imports without it."""

import os

import torch
import torch.distributed as dist


def accelerate_loop(ctx, batches=5, empty_rank=None, empty_batch=None):
    """``scripts/accelerate_loop.py`` as a rank function: ``Accelerator(cpu=True)`` on the world's process group,
    ``prepare`` (DDP, and accelerate's ``DataLoaderShard``, which fetches one batch ahead), a rank whose batch is empty
    ``continue``s, every rank meets at a closing ``wait_for_everyone()``. ``empty_rank``/``empty_batch``: that batch
    is itself empty."""
    from accelerate import Accelerator
    from torch.utils.data import DataLoader, TensorDataset

    # accelerate reads the world from torchrun's variables; it then takes the process group already made
    world = {"RANK": ctx.rank, "LOCAL_RANK": ctx.rank, "WORLD_SIZE": ctx.world_size, "LOCAL_WORLD_SIZE": ctx.world_size}
    os.environ.update({k: str(v) for k, v in world.items()})
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    samples = 4 * batches * ctx.world_size
    data = TensorDataset(torch.randn(samples, 8), torch.randn(samples, 1))
    model = torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer, loader = accelerator.prepare(model, optimizer, DataLoader(data, batch_size=4))
    for i, (x, y) in enumerate(loader):
        ctx.step(i)
        if ctx.rank == empty_rank and i == empty_batch:
            x, y = x[:0], y[:0]
        if len(x) == 0:
            continue
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        accelerator.backward(loss)
        optimizer.step()
    accelerator.wait_for_everyone()
    return dist.get_world_size()
