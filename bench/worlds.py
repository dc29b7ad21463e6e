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


def plain_train(ctx, batches=4):
    """What ``bench/train_script.py`` does, as a rank function: DataLoader + DistributedSampler + DDP + AdamW."""
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    torch.manual_seed(0)
    samples = 4 * batches * ctx.world_size
    data = TensorDataset(torch.randn(samples, 8), torch.randn(samples, 1))
    sampler = DistributedSampler(data, shuffle=True, seed=0)
    model = DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    for step, (x, y) in enumerate(DataLoader(data, batch_size=4, sampler=sampler)):
        ctx.step(step)
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
