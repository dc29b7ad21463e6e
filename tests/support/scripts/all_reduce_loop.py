"""A plain torchrun-style script, no ddpfaults import: one all_reduce and one optimizer step per step (the optimizer
counts the steps), then every rank meets at a closing barrier."""

import argparse

import torch
import torch.distributed as dist


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    weight = torch.nn.Parameter(torch.ones(1))
    optimizer = torch.optim.SGD([weight], lr=0.0)
    total = torch.ones(1)
    for _ in range(args.steps):
        dist.all_reduce(total)
        optimizer.step()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
