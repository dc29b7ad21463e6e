"""A plain torchrun-style script, no ddpfaults import: two process groups of the whole world, ``a`` then ``b``,
every rank making both; each step all_reduces 2 elements in ``a`` and 3 in ``b``, and an optimizer step counts it.
``--swap-rank R``: rank R makes ``b`` first (groups made in another order on one rank: torch names groups by a
per-process counter, so the two ranks' ``a`` and ``b`` are wired crosswise). ``--extra-rank R``: rank R first makes
a group of its own, which no other rank makes."""

import argparse

import torch
import torch.distributed as dist


def make_groups(rank: int, world: int, swap_rank=None, extra_rank=None) -> dict:
    """The groups ``a`` and ``b`` of the whole world, made as the options say: ``{"a": group, "b": group}``."""
    everyone = list(range(world))
    if rank == extra_rank:
        dist.new_group([rank], group_desc="extra")
    order = ("b", "a") if rank == swap_rank else ("a", "b")
    return {desc: dist.new_group(everyone, group_desc=desc) for desc in order}


def train_step(groups: dict) -> None:
    """One step's all_reduces: 2 elements in ``a``, then 3 in ``b``."""
    dist.all_reduce(torch.ones(2), group=groups["a"])
    dist.all_reduce(torch.ones(3), group=groups["b"])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--swap-rank", type=int)
    parser.add_argument("--extra-rank", type=int)
    parser.add_argument("--steps", type=int, default=2)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    groups = make_groups(rank, world, args.swap_rank, args.extra_rank)
    weight = torch.nn.Parameter(torch.ones(1))
    optimizer = torch.optim.SGD([weight], lr=0.1)
    for _ in range(args.steps):
        train_step(groups)
        weight.grad = torch.ones(1)
        optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
