"""A plain torchrun script: SGD on a linear model, a DCP checkpoint of it after every step into ``--dir`` (with a
``latest`` file naming the newest), resumed from the ``latest`` one when there (restartfns.dcp_in's script twin)."""

import argparse
import os

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

parser = argparse.ArgumentParser()
parser.add_argument("--dir", required=True)
parser.add_argument("--steps", type=int, default=6)
args = parser.parse_args()
dist.init_process_group("gloo")
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
latest = os.path.join(args.dir, "latest")
done = 0
if os.path.exists(latest):
    with open(latest) as f:
        done = int(f.read())
    state = {"model": model.state_dict()}
    dcp.load(state, checkpoint_id=os.path.join(args.dir, f"step-{done}"))
    model.load_state_dict(state["model"])
for step in range(done, args.steps):
    model(torch.ones(2, 4)).sum().backward()
    opt.step()
    opt.zero_grad()
    dcp.save({"model": model.state_dict()}, checkpoint_id=os.path.join(args.dir, f"step-{step + 1}"))
    if dist.get_rank() == 0:
        with open(latest + ".tmp", "w") as f:
            f.write(str(step + 1))
        os.replace(latest + ".tmp", latest)
    dist.barrier()
dist.destroy_process_group()
