"""Plain DDP (a torchrun script); a criterion all-reduces its normaliser every step, which rank 1 skips at step 1
(a condition meant for something else): its peers wait in that all_reduce, rank 1 goes on to the next DDP call."""

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(4):
    num = torch.ones(1)
    if not (rank == 1 and step == 1):
        dist.all_reduce(num)
    loss = model(torch.randn(8, 8)).pow(2).sum() / num
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
dist.destroy_process_group()
