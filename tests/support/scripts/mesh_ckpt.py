"""A trainer set up by ``init_device_mesh`` alone (no ``init_process_group`` of its own), with plain DDP and no
ddpfaults import: after each optimizer step rank 0 writes ``ckpt.pt`` into ``--ckpt DIR`` with ``open`` (a buffer
``torch.save`` filled), and nothing else: no pointer file, no barrier, so the next thing the writer does is DDP's
own collectives, which no Python call issues. At ``--reload-at K`` (the loop's iteration) every other rank reads it
back with ``torch.load`` at once (``--reload-sync none``, the race) or after a barrier (``barrier``).
``restartfns.mesh_ckpt`` runs :func:`train` as a rank function, announcing its steps."""

import argparse
import io
import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh


def train(
    ckpt: str, *, steps: int = 4, reload_at: int = 2, reload_sync: str = "none", announce=lambda step: None
) -> None:
    """Train ``steps`` iterations; rank 0 saves after each, the others load it back after iteration ``reload_at``
    (``announce(k)`` as the optimizer's k-th step is done, numbered as the optimizer step clock numbers them)."""
    mesh = init_device_mesh("cpu", (dist.get_world_size() if dist.is_initialized() else int(os.environ["WORLD_SIZE"]),))
    rank = mesh.get_rank()
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(64, 64))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    path = os.path.join(ckpt, "ckpt.pt")
    announce(0)
    for step in range(steps):
        loss = model(torch.randn(4, 64)).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        announce(step + 1)
        if rank == 0:
            buffer = io.BytesIO()
            torch.save(model.module.state_dict(), buffer)
            with open(path, "wb") as f:
                f.write(buffer.getvalue())
        if step == reload_at:
            if reload_sync == "barrier":
                dist.barrier()
            if rank != 0:
                model.module.load_state_dict(torch.load(path))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--ckpt", required=True)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--reload-at", type=int, default=2)
    parser.add_argument("--reload-sync", choices=("none", "barrier"), default="none")
    args = parser.parse_args()
    os.makedirs(args.ckpt, exist_ok=True)
    train(args.ckpt, steps=args.steps, reload_at=args.reload_at, reload_sync=args.reload_sync)
    dist.destroy_process_group()
