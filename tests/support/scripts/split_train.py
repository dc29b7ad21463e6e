"""A plain torchrun training script that ends at a closing ``dist.barrier()``: DataLoader + DistributedSampler +
DDP + SGD, no ddpfaults import. A rank whose batch is empty ``continue``s (skips forward, backward and step).

``--empty-rank R --empty-batch B``: that rank's batch B is itself empty (no injected fault); ``--short-rank R``: that
rank's data itself runs out one batch early. Either way the rank's gradient all_reduces pair with its peers' next
ones without error, and the world hangs at the closing barrier. ``--criterion``: each step's criterion all_reduces
its sample count first (as DETR-style criteria do), and an empty batch skips the criterion but not backward (a zero
loss): its gradient all_reduce meets a peer's count all_reduce, and gloo's size check aborts a receiving rank.
"""

import argparse

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", type=int, default=5, help="batches per rank")
    parser.add_argument("--empty-rank", type=int, default=None)
    parser.add_argument("--empty-batch", type=int, default=None)
    parser.add_argument("--short-rank", type=int, default=None)
    parser.add_argument("--criterion", action="store_true")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    samples = 4 * args.batches * world_size
    data = TensorDataset(torch.randn(samples, 8), torch.randn(samples, 1))
    sampler = DistributedSampler(data, shuffle=False)
    if rank == args.short_rank:
        sampler = list(sampler)[:-4]
    loader = DataLoader(data, batch_size=4, sampler=sampler)
    model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.Linear(64, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for i, (x, y) in enumerate(loader):
        if rank == args.empty_rank and i == args.empty_batch:
            x, y = x[:0], y[:0]
        if len(x) == 0 and not args.criterion:
            continue
        if len(x) == 0:
            loss = model(x).sum() * 0.0  # the criterion, and its count all_reduce, skipped: backward still runs
        else:
            if args.criterion:
                dist.all_reduce(torch.tensor([float(len(x))]))
            loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
