"""A plain torchrun-style script whose ranks reach ``init_process_group`` at different times: rank ``--fail`` raises
before it, rank ``--late`` calls it ``--delay`` seconds after the others; then every rank all_reduces once."""

import argparse
import os
import time

import torch
import torch.distributed as dist


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--fail", type=int, required=True)
    parser.add_argument("--late", type=int, required=True)
    parser.add_argument("--delay", type=float, default=1.0)
    args = parser.parse_args()
    rank = int(os.environ["RANK"])
    if rank == args.fail:
        raise ValueError(f"rank {rank} found no data")
    if rank == args.late:
        time.sleep(args.delay)
    dist.init_process_group("gloo")
    total = torch.ones(1)
    dist.all_reduce(total)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
