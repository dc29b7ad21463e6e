"""A GPU-written FSDP2 script with a gradient divide factor, as LLM trainers set it: ``fully_shard`` with no mesh
(FSDP2 makes its default one through its own reference to ``init_device_mesh``, on the accelerator's device type),
``set_gradient_divide_factor``, AdamW, three steps."""

import os

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

dist.init_process_group("nccl")
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 1)).cuda()
for layer in model:
    fully_shard(layer)
fully_shard(model)
model.set_gradient_divide_factor(float(dist.get_world_size() * 2))  # as LLM trainers set it
opt = torch.optim.AdamW(model.parameters())
for _ in range(3):
    model(torch.randn(4, 8, device="cuda")).sum().backward()
    opt.step()
    opt.zero_grad()
print("done")
dist.destroy_process_group()
