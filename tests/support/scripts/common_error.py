"""A script that fails the same way on every rank, on its own: a GPU-only call on a CPU box (``--error cuda``:
``torch.cuda.set_device``, which on a CPU build of torch raises the same error on every rank), or DDP given
``device_ids`` for a CPU module (``--error device_ids``: a ``ValueError`` whose message names each rank's own
device id). ``--steps N`` trains N steps first (an all_reduce each) so that the failure comes mid-run."""

import argparse

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--error", choices=("cuda", "device_ids"), default="cuda")
    parser.add_argument("--steps", type=int, default=0)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    for _ in range(args.steps):
        dist.all_reduce(torch.ones(2))
    if args.error == "cuda":
        torch.cuda.set_device(rank)
    else:
        DistributedDataParallel(torch.nn.Linear(2, 2), device_ids=[rank])
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
