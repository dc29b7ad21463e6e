"""A torchrun training script that checkpoints every optimizer step into its working directory and resumes from
there (model, optimizer, step count, RNG): no ddpfaults import. Prints its restart count and store port."""

import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

STEPS = 6

dist.init_process_group("gloo")
print(f"restart {os.environ['TORCHELASTIC_RESTART_COUNT']} port {os.environ['MASTER_PORT']}", flush=True)
torch.manual_seed(0)
model = DistributedDataParallel(
    torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.5), torch.nn.Linear(8, 1))
)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
done = 0
if os.path.exists("ckpt.pt"):
    state = torch.load("ckpt.pt")
    model.module.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    torch.set_rng_state(state["rng"])
    done = state["done"]
data = torch.Generator().manual_seed(dist.get_rank())
batches = [(torch.randn(4, 4, generator=data), torch.randn(4, 1, generator=data)) for _ in range(STEPS)]
for step in range(done, STEPS):
    x, y = batches[step]
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    if dist.get_rank() == 0:
        state = {"model": model.module.state_dict(), "opt": opt.state_dict(), "rng": torch.get_rng_state()}
        torch.save({**state, "done": step + 1}, "ckpt.tmp")
        os.replace("ckpt.tmp", "ckpt.pt")
    dist.barrier()
dist.destroy_process_group()
