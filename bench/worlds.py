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


def wide_train(ctx, width=1024, steps=20, every=5):
    """DDP SGD steps of a 3-layer MLP ``width`` wide (2.1M parameters at 1024), resuming from the checkpoint rank 0
    writes to the shared dir every ``every`` steps (model, optimizer, step): a model whose state is not tiny."""
    import os

    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    layers = [torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, width), torch.nn.ReLU()]
    model = DistributedDataParallel(torch.nn.Sequential(*layers, torch.nn.Linear(width, 10)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    path, start = os.path.join(ctx.shared_dir, "ckpt.pt"), 0
    if os.path.exists(path):
        state = torch.load(path)
        model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = state["step"]
    generator = torch.Generator().manual_seed(1)
    x, y = torch.randn(32, width, generator=generator), torch.randint(0, 10, (32,), generator=generator)
    for step in range(start, steps):
        ctx.step(step)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if ctx.rank == 0 and (step + 1) % every == 0:
            state = {"model": model.module.state_dict(), "optimizer": optimizer.state_dict(), "step": step + 1}
            torch.save(state, path + ".tmp")
            os.replace(path + ".tmp", path)
        dist.barrier()
    return steps


def recorded(ctx, train, recorded=True, **kwargs):
    """``train(ctx, **kwargs)``; with ``recorded=False`` the rank's file record unheard: the resume check's capture
    stops listening to the audit hook (which stays installed: an audit hook cannot be removed), so the check runs
    without its file record. ``bench_restarts.py`` times the check both ways, each through this function (the same
    module loaded, the same frames)."""
    from ddpfaults.rank import files, resume

    capture = resume._capture
    if capture is not None and not recorded:
        files.unlisten(ctx, capture.note)
    return train(ctx, **kwargs)
