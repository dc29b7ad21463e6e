"""A torchrun script that checkpoints the common atomic-minded way and never calls ``torch.save`` on a path: rank 0
serialises into memory (``torch.save(state, buffer)``), then writes ``ckpt_{steps done:06d}.pt`` with ``open`` and a
``latest`` file naming it, into ``--ckpt DIR``; every rank resumes from ``latest`` when it is there (reading the
checkpoint with ``open`` too). ``--atomic`` writes each file to a temporary name, then ``os.replace``-s it into place;
``--fixed-name`` writes every checkpoint to ``ckpt.pt``. ``--reload-at K``: after rank 0's save at step ``K`` every
other rank reads that checkpoint back (with ``open``) and loads it; ``--reload-sync none`` reads at once (the race),
``barrier`` after a barrier the writer meets once its save is done.
``--bug`` is one of the resumes gone wrong: ``counter`` (the step counter saved one step short: a step replayed),
``data`` (the data restarted from its first batch), ``rng`` (the RNG states not restored: dropout draws other masks),
``scheduler`` (the LR scheduler not saved). No ddpfaults import; ``restartfns.buffer_ckpt`` runs :func:`train` as a
rank function."""

import argparse
import io
import os
import random

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def train(
    ckpt: str,
    *,
    steps: int = 8,
    bug: str = "none",
    atomic: bool = False,
    fixed_name=False,
    reload_at: int = -1,
    reload_sync: str = "none",
    announce=lambda step: None,
) -> int:
    """Train ``steps`` steps, resuming from ``ckpt`` when it holds a checkpoint (``announce(step)`` as each step
    begins); at step ``reload_at`` the ranks but 0 load the checkpoint rank 0 saved (after a barrier if
    ``reload_sync`` is ``barrier``); return the first step this run made."""

    def write(path: str, data: bytes) -> None:
        with open(path + ".tmp" if atomic else path, "wb") as f:
            f.write(data)
        if atomic:
            os.replace(path + ".tmp", path)

    rank = dist.get_rank()
    torch.manual_seed(0)
    random.seed(0)
    layers = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.2), torch.nn.Linear(8, 1))
    model = DistributedDataParallel(layers)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    data = torch.Generator().manual_seed(100 + rank)
    batches = [(torch.randn(4, 4, generator=data), torch.randn(4, 1, generator=data)) for _ in range(steps)]
    latest = os.path.join(ckpt, "latest")
    start = 0
    if os.path.exists(latest):
        with open(latest) as f:
            name = f.read().strip()
        with open(os.path.join(ckpt, name), "rb") as f:
            state = torch.load(io.BytesIO(f.read()), weights_only=False)
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        if bug != "scheduler":
            scheduler.load_state_dict(state["scheduler"])
        if bug != "rng":
            torch.set_rng_state(state["torch_rng"])
            random.setstate(state["random"])
        start = state["step"]
    for step in range(start, steps):
        announce(step)
        x, y = batches[step - start if bug == "data" else step]
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        scheduler.step()
        name = "ckpt.pt" if fixed_name else f"ckpt_{step + 1:06d}.pt"
        if rank == 0:
            os.makedirs(ckpt, exist_ok=True)
            state = {
                "model": model.module.state_dict(),
                "opt": opt.state_dict(),
                "scheduler": scheduler.state_dict(),
                "torch_rng": torch.get_rng_state(),
                "random": random.getstate(),
                "step": step if bug == "counter" else step + 1,
            }
            buffer = io.BytesIO()
            torch.save(state, buffer)
            write(os.path.join(ckpt, name), buffer.getvalue())
            write(latest, name.encode())
        if step == reload_at:
            if reload_sync == "barrier":
                dist.barrier()
            if rank != 0:
                with open(os.path.join(ckpt, name), "rb") as f:
                    model.module.load_state_dict(torch.load(io.BytesIO(f.read()), weights_only=False)["model"])
        dist.barrier()
    return start


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--ckpt", required=True)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--bug", choices=("none", "counter", "data", "rng", "scheduler"), default="none")
    parser.add_argument("--atomic", action="store_true")
    parser.add_argument("--fixed-name", action="store_true")
    parser.add_argument("--reload-at", type=int, default=-1)
    parser.add_argument("--reload-sync", choices=("none", "barrier"), default="none")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    options = {"bug": args.bug, "atomic": args.atomic, "fixed_name": args.fixed_name}
    train(args.ckpt, steps=args.steps, reload_at=args.reload_at, reload_sync=args.reload_sync, **options)
    dist.destroy_process_group()
