"""Rank functions of the restart and preemption tests (module level: the ranks import them)."""

import contextlib
import os
import signal
import sys
import threading
import time

import torch
import torch.distributed as dist


@contextlib.contextmanager
def stop_on_notice():
    """Yield ``stopping()``: True once a SIGTERM reached any rank (a flag its handler sets, all-reduced: every rank
    calls it once a step). The previous SIGTERM handler is restored on the way out."""
    stop = torch.zeros(1)
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: stop.fill_(1))

    def stopping() -> bool:
        flag = stop.clone()
        dist.all_reduce(flag)
        return bool(flag.item())

    try:
        yield stopping
    finally:
        signal.signal(signal.SIGTERM, previous)


def counting(ctx, steps=4):
    """All-reduce once per step, noting the steps done in ``ctx.shared_dir``; resume from there. Returns the step
    this attempt started at and its attempt number."""
    path = os.path.join(ctx.shared_dir, "done")
    start = int(open(path).read()) if os.path.exists(path) else 0
    t = torch.ones(1)
    for step in range(start, steps):
        ctx.step(step)
        dist.all_reduce(t)
        if ctx.rank == 0:
            with open(path + ".tmp", "w") as f:
                f.write(str(step + 1))
            os.replace(path + ".tmp", path)
        dist.barrier()
    return start, ctx.attempt


def ignores_notice(ctx, steps=3):
    """Every rank ignores SIGTERM; at step 1 rank 1 then works on (sleeping, outside any collective) for 30 s."""
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: None)
    try:
        t = torch.ones(1)
        for step in range(steps):
            ctx.step(step)
            if ctx.rank == 1 and step == 1:
                # fixed: works on past the notice's grace, as the test needs: SIGKILL comes at 0.5 s, not 30
                time.sleep(30)
            dist.all_reduce(t)
    finally:
        signal.signal(signal.SIGTERM, previous)
    return float(t)


def dcp_saves_on_notice(ctx, steps=4, asynchronous=False):
    """All-reduce a stop flag each step; once SIGTERM set it on any rank, every rank saves a model's state with
    ``dcp.save`` (``dcp.async_save``, awaited, when ``asynchronous``) into ``ctx.shared_dir`` and stops. Returns the
    step it stopped at (None: it was never preempted)."""
    import torch.distributed.checkpoint as dcp

    model = torch.nn.Linear(2, 1)
    with stop_on_notice() as stopping:
        for step in range(steps):
            ctx.step(step)
            if stopping():
                where = os.path.join(ctx.shared_dir, f"step-{step}")
                if asynchronous:
                    dcp.async_save({"model": model.state_dict()}, checkpoint_id=where).result()
                else:
                    dcp.save({"model": model.state_dict()}, checkpoint_id=where)
                return step
    return None


def exits_on_notice(ctx, steps=4, code=1):
    """All-reduce once a step; every rank's SIGTERM handler ends it with ``sys.exit(code)``, as a trainer's handler
    that cleans up and exits does."""
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(code))
    try:
        t = torch.ones(1)
        for step in range(steps):
            ctx.step(step)
            dist.all_reduce(t)
    finally:
        signal.signal(signal.SIGTERM, previous)
    return float(t)


class SlowToPickle:
    """Pickling it takes ``seconds``: a checkpoint holding it takes that long to write, as a large model's does."""

    def __init__(self, seconds):
        self.seconds = seconds

    def __reduce__(self):
        time.sleep(self.seconds)
        return (SlowToPickle, (0.0,))


def periodic_save_over_the_notice(ctx, steps=6, every=2, seconds=1.0):
    """A checkpoint every ``every`` steps, written by a thread (``torch.save`` into ``ctx.shared_dir``, taking
    ``seconds``) while training goes on, and a SIGTERM handler that sets a stop flag the ranks all-reduce each step:
    once it is set every rank waits for the checkpoint under way and stops without saving another (the periodic one
    begun before the notice ends after it). Returns the step it stopped at (None: it was never preempted)."""
    model = torch.nn.Linear(2, 1)
    writer = None
    with stop_on_notice() as stopping:
        for step in range(steps):
            ctx.step(step)
            if stopping():
                writer.join()
                return step
            if step % every == every - 1:
                state = {"model": model.state_dict(), "slow": SlowToPickle(seconds)}
                path = os.path.join(ctx.shared_dir, f"rank{ctx.rank}-step{step}.pt")
                writer = threading.Thread(target=torch.save, args=(state, path))
                writer.start()
    return None


def forgets_weight_decay(ctx, steps=8, forget=True):
    """DDP + SGD (momentum, weight decay 0.1) checkpointing to ``ctx.shared_dir`` after every step and resuming from
    it; when ``forget``, a resumed attempt then sets weight decay 0 (a config the resume did not keep): the
    parameters, optimizer state, learning rate, RNG and batches it resumed with are all the uninterrupted run's,
    only what its steps do differs. Returns the attempt's first step."""
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    ddp = DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9, weight_decay=0.1)
    path = os.path.join(ctx.shared_dir, "ckpt.pt")
    start = 0
    if os.path.exists(path):
        state = torch.load(path)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = state["done"]
        if forget:
            for group in opt.param_groups:
                group["weight_decay"] = 0.0
    for step in range(start, steps):
        ctx.step(step)
        generator = torch.Generator().manual_seed(step * 100 + ctx.rank)
        x, y = torch.randn(8, 4, generator=generator), torch.randn(8, 1, generator=generator)
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if ctx.rank == 0:
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "done": step + 1}, path + ".tmp")
            os.replace(path + ".tmp", path)
        dist.barrier()
    return start


def two_optimizers(ctx, steps=6, restore_second=True):
    """DDP over two layers, each with its own SGD (momentum) stepping in turn as a GAN's generator and discriminator
    do, checkpointing both to ``ctx.shared_dir`` after every step and resuming from it; unless ``restore_second`` a
    resumed attempt leaves the second optimizer's state out. Returns the attempt's first step."""
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    first, second = torch.nn.Linear(4, 4), torch.nn.Linear(4, 1)
    ddp = DistributedDataParallel(torch.nn.Sequential(first, second))
    opts = [torch.optim.SGD(layer.parameters(), lr=0.1, momentum=0.9) for layer in (first, second)]
    path, start = os.path.join(ctx.shared_dir, "ckpt.pt"), 0
    if os.path.exists(path):
        state = torch.load(path)
        ddp.module.load_state_dict(state["model"])
        for opt, saved in zip(opts if restore_second else opts[:1], state["opts"], strict=False):
            opt.load_state_dict(saved)
        start = state["done"]
    for step in range(start, steps):
        ctx.step(step)
        x = torch.randn(8, 4, generator=torch.Generator().manual_seed(step))
        for opt in opts:
            opt.zero_grad()
        ddp(x).pow(2).mean().backward()
        for opt in opts:
            opt.step()
        if ctx.rank == 0:
            state = {"model": ddp.module.state_dict(), "opts": [o.state_dict() for o in opts], "done": step + 1}
            torch.save(state, path + ".tmp")
            os.replace(path + ".tmp", path)
        dist.barrier()
    return start


def dcp_in(ctx, directory, steps=6):
    """SGD on a linear model, a DCP checkpoint of it after every step into ``directory`` (a path outside the run's
    own), resumed from its ``latest`` one when there."""
    import torch.distributed.checkpoint as dcp

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    latest = os.path.join(directory, "latest")
    done = 0
    if os.path.exists(latest):
        with open(latest) as f:
            done = int(f.read())
        state = {"model": model.state_dict()}
        dcp.load(state, checkpoint_id=os.path.join(directory, f"step-{done}"))
        model.load_state_dict(state["model"])
    for step in range(done, steps):
        ctx.step(step)
        model(torch.ones(2, 4)).sum().backward()
        opt.step()
        opt.zero_grad()
        dcp.save({"model": model.state_dict()}, checkpoint_id=os.path.join(directory, f"step-{step + 1}"))
        if ctx.rank == 0:
            with open(latest + ".tmp", "w") as f:
                f.write(str(step + 1))
            os.replace(latest + ".tmp", latest)
        dist.barrier()
    return done


def buffer_ckpt(ctx, directory=None, **options):
    """``scripts/buffer_ckpt.py``'s trainer as a rank function (``ctx.step`` announcing its steps), checkpointing into
    ``directory`` (default ``ctx.shared_dir``, the run's own); ``options``: its ``steps``, ``bug``, ``atomic``,
    ``fixed_name``, ``reload_at``, ``reload_sync``.
    Returns the attempt's first step."""
    import runpy

    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "buffer_ckpt.py")
    train = runpy.run_path(script)["train"]
    return train(directory or ctx.shared_dir, announce=ctx.step, **options)


def mesh_ckpt(ctx, **options):
    """``scripts/mesh_ckpt.py``'s trainer as a rank function (``ctx.step`` announcing its optimizer's steps),
    checkpointing into ``ctx.shared_dir``; ``options``: its ``steps``, ``reload_at``, ``reload_sync``."""
    import runpy

    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "mesh_ckpt.py")
    runpy.run_path(script)["train"](ctx.shared_dir, announce=ctx.step, **options)
