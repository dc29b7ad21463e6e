"""At step 2 rank 0 sends SIGTERM to every rank of the world, itself included, as a scheduler stopping the job does;
every rank all-reduces once per step (a torchrun-style script: env:// process group, no handler of its own)."""

import os
import signal
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
pids = [None] * dist.get_world_size()
dist.all_gather_object(pids, os.getpid())
t = torch.ones(1)
for step in range(6):
    if step == 2 and dist.get_rank() == 0:
        for pid in pids:
            os.kill(pid, signal.SIGTERM)
    dist.all_reduce(t)
    # fixed: the steps' pace: rank 0's SIGTERM ends every rank at its step whatever the pace
    time.sleep(0.05)
dist.destroy_process_group()
