"""Writes what a torchrun worker sees (environment, argv, __name__, cwd, sys.path[0]) to DIR/rankN.json."""

import json
import os
import sys

import torch.distributed as dist

KEYS = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "ROLE_RANK",
    "ROLE_NAME",
    "GROUP_WORLD_SIZE",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_USE_AGENT_STORE",
)

if __name__ == "__main__":
    out = sys.argv[1]
    dist.init_process_group("gloo")
    seen = {
        "env": {k: os.environ.get(k) for k in KEYS},
        "argv": sys.argv,
        "name": __name__,
        "cwd": os.getcwd(),
        "path0": sys.path[0],
        "world": [dist.get_rank(), dist.get_world_size()],
    }
    with open(os.path.join(out, f"rank{dist.get_rank()}.json"), "w") as f:
        json.dump(seen, f)
    dist.barrier()
    dist.destroy_process_group()
    sys.exit(0)
