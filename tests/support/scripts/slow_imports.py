"""A healthy script whose imports take ``argv[1]`` CPU seconds on every rank (``argv[2]``, if given: on that rank
only), then one all_reduce: slow to start, never hung."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
if len(sys.argv) < 3 or os.environ["RANK"] == sys.argv[2]:
    import cpu_heavy_import  # noqa: F401

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
total = torch.ones(1)
dist.all_reduce(total)
assert total.item() == dist.get_world_size()
dist.destroy_process_group()
