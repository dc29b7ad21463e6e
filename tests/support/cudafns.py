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


def fsdp_gradient_sums(ctx, divide_factor=None):
    """FSDP2 on a "cuda" mesh, one backward with the reduce-scatter's ``divide_factor`` (NCCL's PREMUL_SUM unless it is
    the world size); returns each parameter's full gradient's sum, and the same sums of a local model's gradient
    averaged over every rank's input (what the ranks' average must give)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    def build():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))

    reference = build()
    for rank in range(ctx.world_size):
        (reference(torch.full((4, 8), 1.0 + rank)).pow(2).mean() / ctx.world_size).backward()
    model = build().to(ctx.rank)
    mesh = init_device_mesh("cuda", (ctx.world_size,))
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    if divide_factor is not None:  # each fully_shard module's own parameters
        for module in (model[0], model[2], model):
            module.set_gradient_divide_factor(divide_factor)
    ctx.step(0)
    model(torch.full((4, 8), 1.0 + ctx.rank, device="cuda")).pow(2).mean().backward()
    sums = [float(p.grad.full_tensor().sum()) for p in model.parameters()]
    return sums, [float(p.grad.sum()) for p in reference.parameters()]
