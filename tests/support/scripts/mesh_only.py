"""A healthy torchrun script whose only set-up is ``init_device_mesh`` (as FSDP2 and tensor-parallel scripts are set
up: no ``init_process_group`` of its own), then three all_reduces over the mesh's group; prints ``done`` and the
value."""

import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

mesh = init_device_mesh("cpu", (int(os.environ["WORLD_SIZE"]),))
t = torch.ones(1)
for _ in range(3):
    dist.all_reduce(t, group=mesh.get_group())
print("done", float(t))
