"""A plain torchrun script, no ddpfaults import, with code that runs on rank 0 only, as trainers write it:
``--what evaluate`` evaluates on the main process (an all_reduce of its metrics rank 1 never makes: gloo aborts a
rank); ``--what barrier`` has a callback wait in ``dist.barrier()`` on rank 0 only (a hang). DDP, a DataLoader,
SGD; ``--at`` the step it happens at."""

import argparse

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def is_main_process():
    return dist.get_rank() == 0


def evaluate(model):
    with torch.no_grad():
        loss = model(torch.randn(16, 8)).pow(2).mean()
    metrics = torch.stack([loss, loss.abs(), loss.sqrt()])
    dist.all_reduce(metrics)
    return metrics


def on_step_end(step, at):
    if step == at:
        dist.barrier()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--what", choices=("evaluate", "barrier"), default="evaluate")
    parser.add_argument("--at", type=int, default=2)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64 * dist.get_world_size(), 8), torch.randn(64 * dist.get_world_size(), 1))
    loader = DataLoader(data, batch_size=8, sampler=DistributedSampler(data, shuffle=False))
    model = DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step, (x, y) in enumerate(loader):
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if args.what == "evaluate" and step == args.at and is_main_process():
            evaluate(model)
        if args.what == "barrier" and rank == 0:
            on_step_end(step, args.at)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
