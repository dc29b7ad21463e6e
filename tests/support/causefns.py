"""Rank functions whose worlds end for a cause no one rank's divergence is (tests/engine/test_causes_worlds.py)."""

import torch
import torch.distributed as dist


def gpu_call_on_cpu(ctx, steps=2):
    """``steps`` steps of an all_reduce, then a GPU-only call every rank makes alike: on a CPU build of torch each
    raises the same ``AttributeError`` at the same line, on its own."""
    for step in range(steps):
        ctx.step(step)
        dist.all_reduce(torch.ones(2))
    torch.cuda.set_device(ctx.rank)


def adamw_dcp_round_trip(ctx, checkpoint_dir, steps=2):
    """FSDP2 with AdamW trains ``steps`` steps, saves the model's and the optimizer's state with DCP at step
    ``steps`` and loads both into a fresh model and optimizer (AdamW's replicated step counters are stored once, in
    one rank's file)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (ctx.world_size,))

    def build(seed):
        torch.manual_seed(seed)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
        for layer in (model[0], model[2]):
            fully_shard(layer, mesh=mesh)
        model = fully_shard(model, mesh=mesh)
        return model, torch.optim.AdamW(model.parameters(), lr=0.01)

    model, optimizer = build(0)
    torch.manual_seed(1 + ctx.rank)
    for step in range(steps):
        ctx.step(step)
        loss = model(torch.randn(4, 8)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    ctx.step(steps)
    model_state, optim_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=checkpoint_dir)
    fresh, fresh_optimizer = build(1)
    model_state, optim_state = get_state_dict(fresh, fresh_optimizer)
    state = {"model": model_state, "optim": optim_state}
    dcp.load(state, checkpoint_id=checkpoint_dir)
    set_state_dict(fresh, fresh_optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])


def rank0_only(ctx, what="barrier", at=2, steps=5):
    """DDP trains ``steps`` steps; at step ``at`` the main process alone evaluates (``what="evaluate"``: an
    all_reduce of three metrics its peers never make) or waits in a callback's ``dist.barrier()``
    (``what="barrier"``), as trainers write code for rank 0."""
    model = ctx.ddp(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(steps):
        ctx.step(step)
        loss = model(torch.randn(8, 8)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step == at and dist.get_rank() == 0:
            if what == "evaluate":
                dist.all_reduce(torch.stack([loss.detach(), loss.detach().abs(), loss.detach().sqrt()]))
            else:
                dist.barrier()


def skips_then_makes_up(ctx, steps=8, rank=1, skip=3, sends=0):
    """An all_reduce of a gradient-sized tensor every step; ``rank`` skips it at step ``skip`` and makes two at the
    last step: every rank makes as many, same-size ones, and the world completes, each step from ``skip`` on
    reduced against another step's. ``sends``: first, rank 0 sends each peer that many tensors
    (:func:`uneven_sends`)."""
    uneven_sends(sends)
    for step in range(steps):
        ctx.step(step)
        if not (ctx.rank == rank and step == skip):
            dist.all_reduce(torch.full((36,), float(step)))
        if ctx.rank == rank and step == steps - 1:
            dist.all_reduce(torch.full((36,), float(step)))
    dist.barrier()


def uneven_sends(count: int) -> None:
    """Rank 0 sends each peer ``count`` tensors through ``batch_isend_irecv``, each peer receives its own: rank 0
    makes more point-to-point ops than any peer (torch counts them in the group's ``op_id``)."""
    if not count:
        return
    rank, size = dist.get_rank(), dist.get_world_size()
    t = torch.ones(2)
    if rank == 0:
        ops = [dist.P2POp(dist.isend, t, peer) for peer in range(1, size) for _ in range(count)]
    else:
        ops = [dist.P2POp(dist.irecv, torch.empty(2), 0) for _ in range(count)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()


def reduce_through_a_library(ctx, steps=3, alone=None):
    """Each step reduces a metric through an installed library (Lightning's ``_sync_ddp``: a barrier, then an
    all_reduce); ``alone``: the one rank that does so at step 1 (the others go on to the next step's)."""
    from lightning.fabric.utilities.distributed import _sync_ddp

    for step in range(steps):
        ctx.step(step)
        if alone is None or step != 1 or ctx.rank == alone:
            _sync_ddp(torch.ones(3), reduce_op="sum")


def stopped_from_outside(ctx, steps=6, at=2):
    """At step ``at`` rank 0 sends SIGTERM to every rank of the world, itself included, as a scheduler stopping the
    job does (not a fault of the plan); every rank all-reduces once per step."""
    import os
    import signal
    import time

    pids = [None] * ctx.world_size
    dist.all_gather_object(pids, os.getpid())
    t = torch.ones(1)
    for step in range(steps):
        ctx.step(step)
        if step == at and ctx.rank == 0:
            for pid in pids:
                os.kill(pid, signal.SIGTERM)
        dist.all_reduce(t)
        # fixed: the steps' pace: rank 0's SIGTERM ends every rank at its step whatever the pace
        time.sleep(0.05)
    return float(t)


def rank0_barrier_over_a_loader(ctx, at=3):
    """DDP trains over a DataLoader (its batches trained on as they come, an empty one too); after step ``at`` rank
    0 alone waits in a ``dist.barrier()``, as a checkpoint hook written for rank 0 does."""
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    torch.manual_seed(0)
    data = TensorDataset(torch.randn(48 * ctx.world_size, 8), torch.randn(48 * ctx.world_size, 1))
    loader = DataLoader(data, batch_size=8, sampler=DistributedSampler(data, shuffle=False))
    model = ctx.ddp(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step, (x, y) in enumerate(loader):
        ctx.step(step)
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step == at and dist.get_rank() == 0:
            dist.barrier()


def skips_the_criterions_reduce(ctx, rank=1, at=1, steps=4):
    """Plain DDP; a criterion all-reduces its normaliser every step, which rank ``rank`` skips at step ``at`` (the
    regression of a condition meant for something else): its peers' one-element all_reduce meets its gradient
    bucket's, and gloo aborts a receiver on the size mismatch."""
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    model = DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(steps):
        ctx.step(step)
        num = torch.ones(1)
        if not (ctx.rank == rank and step == at):
            dist.all_reduce(num)
        loss = model(torch.randn(8, 8)).pow(2).sum() / num
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
