"""A plain torchrun script, no ddpfaults import, that reduces its metric through an installed library each step
(Lightning's ``_sync_ddp``: a barrier, then an all_reduce), with an optimizer step per step."""

import torch
import torch.distributed as dist
from lightning.fabric.utilities.distributed import _sync_ddp


def main():
    dist.init_process_group("gloo")
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        loss = model(torch.randn(2, 4)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        _sync_ddp(loss.detach(), reduce_op="sum")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
