"""A torchrun script in nanoGPT's manner: no ddpfaults import; reads ``./config.py`` from its working directory
(``exec``, as nanoGPT's configurator), checkpoints every step into ``--ckpt DIR`` (a path outside the working
directory) and resumes from it only when told: ``--init-from resume`` (nanoGPT's ``--init_from=resume``; ``auto``:
if it is there).
``--lose optimizer`` resumes without the optimizer's state (momentum lost)."""

import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

parser = argparse.ArgumentParser()
parser.add_argument("--ckpt", required=True)
parser.add_argument("--init-from", choices=("scratch", "resume", "auto"), default="scratch")
parser.add_argument("--lose", choices=("nothing", "optimizer"), default="nothing")
args = parser.parse_args()
config = {}
exec(open("config.py").read(), config)  # noqa: S102 - nanoGPT's configurator does this
dist.init_process_group("gloo")
torch.manual_seed(0)
model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 1)))
opt = torch.optim.SGD(model.parameters(), lr=config["lr"], momentum=0.9)
path = os.path.join(args.ckpt, "ckpt.pt")
done = 0
if args.init_from == "resume" or (args.init_from == "auto" and os.path.exists(path)):
    state = torch.load(path)
    model.module.load_state_dict(state["model"])
    if args.lose != "optimizer":
        opt.load_state_dict(state["opt"])
    done = state["done"]
data = torch.Generator().manual_seed(dist.get_rank())
batches = [(torch.randn(4, 4, generator=data), torch.randn(4, 1, generator=data)) for _ in range(config["steps"])]
for step in range(done, config["steps"]):
    x, y = batches[step]
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    if dist.get_rank() == 0:
        os.makedirs(args.ckpt, exist_ok=True)
        torch.save({"model": model.module.state_dict(), "opt": opt.state_dict(), "done": step + 1}, path + ".tmp")
        os.replace(path + ".tmp", path)
    dist.barrier()
dist.destroy_process_group()
