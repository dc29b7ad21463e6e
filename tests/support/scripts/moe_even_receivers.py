"""A torchrun script routing MoE tokens with ``all_to_all_single``: every rank receives an even split (no
``output_split_sizes``: the counts are never exchanged); at step 1 rank ``--sender`` routes 4 more tokens to expert
``sender + 1``: 12 tokens where the others send 8."""

import argparse

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--sender", type=int, default=1)
args = parser.parse_args()
dist.init_process_group("gloo")
rank, n = dist.get_rank(), dist.get_world_size()
for step in range(3):
    rows_out = [2] * n
    if rank == args.sender and step == 1:
        rows_out[(args.sender + 1) % n] += 4
    out = torch.empty(2 * n, 4)
    dist.all_to_all_single(out, torch.ones(sum(rows_out), 4), input_split_sizes=rows_out)
dist.destroy_process_group()
