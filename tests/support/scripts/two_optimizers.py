"""An unmodified torchrun script with two optimizers stepping in turn on one batch (a GAN's generator and
discriminator), checkpointing both after every batch and resuming from the checkpoint; ``--lose-second`` leaves the
second optimizer's state out of the resume."""

import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

parser = argparse.ArgumentParser()
parser.add_argument("--lose-second", action="store_true")
args = parser.parse_args()
dist.init_process_group("gloo")
torch.manual_seed(0)
first, second = torch.nn.Linear(4, 4), torch.nn.Linear(4, 1)
ddp = DistributedDataParallel(torch.nn.Sequential(first, second))
opts = [torch.optim.SGD(layer.parameters(), lr=0.1, momentum=0.9) for layer in (first, second)]
path, start = "ckpt.pt", 0
if os.path.exists(path):
    state = torch.load(path)
    ddp.module.load_state_dict(state["model"])
    for opt, saved in zip(opts[:1] if args.lose_second else opts, state["opts"], strict=False):
        opt.load_state_dict(saved)
    start = state["done"]
for batch in range(start, 6):
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(batch))
    for opt in opts:
        opt.zero_grad()
    ddp(x).pow(2).mean().backward()
    for opt in opts:
        opt.step()
    if dist.get_rank() == 0:
        torch.save(
            {"model": ddp.module.state_dict(), "opts": [o.state_dict() for o in opts], "done": batch + 1}, "t.pt"
        )
        os.replace("t.pt", path)
    dist.barrier()
dist.destroy_process_group()
