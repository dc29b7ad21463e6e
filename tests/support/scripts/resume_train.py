"""A plain torchrun training script that resumes from ``model.pt`` in its working directory when one is there,
and saves ``model.pt`` there at the end (rank 0).

The resume is the bug of the field: only rank 0 loads, and after the model is wrapped in DDP (which broadcast
rank 0's weights at construction only), so the ranks train on from different weights and end with different
replicas, though every step's collectives match and the world completes. Run where no ``model.pt`` is, it
trains from the same seed on every rank and ends with equal replicas.
"""

import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(4, 1))
    if rank == 0 and os.path.exists("model.pt"):
        model.module.load_state_dict(torch.load("model.pt"))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(2):
        x = torch.full((2, 4), float(rank + step))
        loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    if rank == 0:
        state = {k: v + 1.0 for k, v in model.module.state_dict().items()}  # a model that is not the fresh one
        torch.save(state, "model.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
