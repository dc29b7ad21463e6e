"""Misbehaving scripts, chosen by argv[1]: each must give a clear verdict naming the cause."""

import os
import sys
import time

import torch.distributed as dist

if __name__ == "__main__":
    what = sys.argv[1]
    if what == "raise_at_import":
        import no_such_module_anywhere  # noqa: F401
    if what == "no_process_group":
        print("training without a process group")
    if what == "init_twice":
        dist.init_process_group("gloo")
        dist.init_process_group("gloo")
    if what == "exit_status":
        dist.init_process_group("gloo")
        print("giving up: bad configuration", file=sys.stderr)
        sys.exit(3)
    if what == "rank_1_never_joins":
        if os.environ["RANK"] == "1":
            time.sleep(3600)  # fixed: stuck before init_process_group (e.g. loading data): never joins
        dist.init_process_group("gloo")
    if what == "exit_message":  # as pytorch/examples' scripts do without GPUs, before any collective
        sys.exit("Unable to locate sufficient gpus to run this example. Exiting.")
