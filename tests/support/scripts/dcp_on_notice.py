"""A torchrun training script that stops on a preemption notice, no ddpfaults import: its SIGTERM handler sets a
flag that the ranks all-reduce after every optimizer step; once set, every rank saves the model with ``dcp.save``
into ``ckpt-<step>`` in its working directory and stops. Prints ``saved ckpt-<step>``."""

import signal

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

stop = torch.zeros(1)
signal.signal(signal.SIGTERM, lambda signum, frame: stop.fill_(1))
dist.init_process_group("gloo")
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(6):
    loss = model(torch.randn(8, 4)).square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    flag = stop.clone()
    dist.all_reduce(flag)
    if flag.item():
        dcp.save({"model": model.state_dict()}, checkpoint_id=f"ckpt-{step}")
        print(f"saved ckpt-{step}", flush=True)
        break
dist.destroy_process_group()
