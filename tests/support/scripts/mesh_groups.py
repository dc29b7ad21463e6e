"""A plain torchrun-style script, no ddpfaults import, whose groups are made the way real code makes them
(``--groups``): ``mesh`` (``init_device_mesh`` as the only set-up, a 1-D mesh), ``new_group`` (every rank makes
every group, with a timeout), ``members`` (each rank makes only the group it belongs to, so torch's per-process
group names collide across groups), ``mesh2d`` (a ("dp", "tp") mesh, with a backend override from torch 2.9),
``nn`` and ``funcol`` (the 2-D mesh's tp group, reduced through ``torch.distributed.nn.functional``, or through
torch's functional collectives, which reach c10d in C++). Each step all_reduces on the world and on the rank's tp
group (pairs of ranks, or the world at 2 ranks), and an optimizer step counts it; then a barrier, "done" and the
world's sum, and every group destroyed. ``--skip-rank R`` has rank R skip its tp all_reduce of step
``--skip-step``: a real divergence inside one tp group."""

import argparse
import datetime
import inspect
import os

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.distributed.nn.functional as dnn
from torch.distributed.device_mesh import init_device_mesh


def tp_group(how: str, world: int, rank: int):
    """The rank's tp group (ranks 2k, 2k+1; the world at 2 ranks), made ``how``."""
    size = 2 if world > 2 else world
    pairs = [list(range(start, start + size)) for start in range(0, world, size)]
    if how in ("mesh2d", "nn", "funcol"):
        options = {"mesh_dim_names": ("dp", "tp")}
        if "backend_override" in inspect.signature(init_device_mesh).parameters:  # torch >= 2.9
            options["backend_override"] = {"tp": "gloo"}
        mesh = init_device_mesh("cpu", (world // size, size), **options)
        return mesh.get_group("tp")
    if how == "new_group":
        made = [dist.new_group(p, timeout=datetime.timedelta(seconds=60)) for p in pairs]
        return made[rank // size]
    return dist.new_group(pairs[rank // size], use_local_synchronization=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--groups", choices=["mesh", "new_group", "members", "mesh2d", "nn", "funcol"], default="mesh")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--skip-rank", type=int, default=-1)
    parser.add_argument("--skip-step", type=int, default=3)
    args = parser.parse_args()
    if args.groups == "mesh":
        init_device_mesh("cpu", (int(os.environ["WORLD_SIZE"]),))
    else:
        dist.init_process_group("gloo")
    world, rank = dist.get_world_size(), dist.get_rank()
    tp = None if args.groups == "mesh" else tp_group(args.groups, world, rank)
    weight = torch.nn.Parameter(torch.ones(1))
    optimizer = torch.optim.SGD([weight], lr=0.0)  # counts the steps
    total = torch.ones(1)
    for step in range(args.steps):
        dist.all_reduce(total)
        if tp is not None and not (step == args.skip_step and rank == args.skip_rank):
            part = torch.ones(2)
            if args.groups == "nn":
                part = dnn.all_reduce(part, group=tp)
            elif args.groups == "funcol":
                part = funcol.all_reduce(part, "sum", tp).sum()  # the sum waits for it
            else:
                dist.all_reduce(part, group=tp)
        optimizer.step()
    dist.barrier()
    print("done", total.item())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
