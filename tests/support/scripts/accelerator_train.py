"""A trainer written through ``torch.accelerator``, as today's pytorch/examples scripts are: it checks the accelerator
first, selects its device by index, derives the backend from the device, passes ``device_id`` to
``init_process_group``, moves its model with ``Module.to(local_rank)``, wraps it in DDP with ``device_ids``, trains
with AdamW over a DistributedSampler, and synchronises the accelerator each step. Prints its final weight sum."""

import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

if not torch.accelerator.is_available() or torch.accelerator.device_count() < int(os.environ["LOCAL_WORLD_SIZE"]):
    sys.exit("Unable to locate an accelerator per local rank")
local_rank = int(os.environ["LOCAL_RANK"])
torch.accelerator.set_device_index(local_rank)
device = torch.device(torch.accelerator.current_accelerator().type, local_rank)
dist.init_process_group(backend=dist.get_default_backend_for_device(device), device_id=device)
torch.manual_seed(0)
data = TensorDataset(torch.randn(256, 16), torch.randn(256, 1))
loader = DataLoader(data, batch_size=16, sampler=DistributedSampler(data, shuffle=False))
model = DistributedDataParallel(torch.nn.Linear(16, 1).to(local_rank), device_ids=[local_rank])
optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
for x, y in loader:
    x, y = x.to(local_rank), y.to(device)
    loss = torch.nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    torch.accelerator.synchronize()
print("weight sum", float(model.module.weight.sum()))
dist.destroy_process_group()
