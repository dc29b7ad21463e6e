"""A torchrun script whose tensor-parallel groups (the ranks split in two halves) are made one of the ways real code
makes them (``--way``): ``new_group`` with a timeout; by their members only (``use_local_synchronization``: each rank
makes just its own group, so torch's per-process group names collide across groups); ``init_device_mesh`` with
``mesh_dim_names`` and ``backend_override``; or plain ``new_group`` with the collectives made through
``torch.distributed.nn.functional``. Four optimizer steps, each with an all_reduce in the tp group and one over the
world; ``--skip-rank R`` skips the tp all_reduce at step 2 on rank R (a real divergence inside one tp group)."""

import argparse
import datetime
import os

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--way", choices=("new_group_timeout", "members_only", "mesh", "nn_functional"), required=True)
parser.add_argument("--skip-rank", type=int, default=None)
args = parser.parse_args()
world, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
half = max(world // 2, 1)
halves = [list(range(i * half, (i + 1) * half)) for i in range(world // half)]
if args.way == "mesh":
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(
        "cpu", (world // half, half), mesh_dim_names=("dp", "tp"), backend_override={"dp": "gloo", "tp": "gloo"}
    )
    tp = mesh["tp"].get_group()
else:
    dist.init_process_group("gloo")
    if args.way == "members_only":
        tp = dist.new_group(halves[rank // half], use_local_synchronization=True)
    else:
        timeout = datetime.timedelta(seconds=120) if args.way == "new_group_timeout" else None
        tp = [dist.new_group(ranks, timeout=timeout) for ranks in halves][rank // half]
t = torch.ones(4, 1)
weight = torch.nn.Parameter(torch.ones(1))
optimizer = torch.optim.SGD([weight], lr=0.1)
for step in range(4):
    if not (rank == args.skip_rank and step == 2):
        if args.way == "nn_functional":
            import torch.distributed.nn.functional as functional

            t = functional.all_reduce(t, group=tp)
        else:
            dist.all_reduce(t, group=tp)
    dist.all_reduce(torch.ones(2))
    weight.grad = torch.ones(1)
    optimizer.step()
print("done", float(t[0]))
