"""A script that fails the same way on every rank, on its own: a GPU-only call on a CPU box (``--error cuda``:
``torch.cuda.set_device``, which on a CPU build of torch raises the same error on every rank), or DDP given
``device_ids`` for a CPU module (``--error device_ids``: a ``ValueError`` whose message names each rank's own
device id). ``--steps N`` trains N steps first (an all_reduce each) so that the failure comes mid-run.
``--slow-joiner R`` makes rank R compute for ``--busy`` seconds inside ``init_process_group``, after gloo connected
it (as a rank starved of CPU on a loaded machine is slow there): the others fail before it has joined. They wait,
on the launcher's store, until rank R is in that computation: without it, a rank R starved while still connecting
gloo's mesh sees the others' processes exit and fails connecting instead (measured beside 4 CPU hogs)."""

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--error", choices=("cuda", "device_ids"), default="cuda")
    parser.add_argument("--steps", type=int, default=0)
    parser.add_argument("--slow-joiner", type=int, default=None)
    parser.add_argument("--busy", type=float, default=1.5)
    args = parser.parse_args()
    if int(os.environ["RANK"]) == args.slow_joiner:
        _slow_to_join(args.busy)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if args.slow_joiner is not None and rank != args.slow_joiner:
        _store().wait([CONNECTED])
    for _ in range(args.steps):
        dist.all_reduce(torch.ones(2))
    if args.error == "cuda":
        torch.cuda.set_device(rank)
    else:
        DistributedDataParallel(torch.nn.Linear(2, 2), device_ids=[rank])
    dist.destroy_process_group()


CONNECTED = "common_error/slow_joiner_connected"


def _store():
    """A client of the store the launcher hosts for the workers (as torchrun's agent does)."""
    return dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False)


def _slow_to_join(seconds):
    """Compute for ``seconds`` at the end of ``init_process_group`` (gloo's mesh connected, the default group not
    set yet), once the others were told it got there."""
    import torch.distributed.distributed_c10d as c10d

    update = c10d._update_default_pg

    def slowly(pg):
        _store().set(CONNECTED, "1")
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            pass
        update(pg)

    c10d._update_default_pg = slowly


if __name__ == "__main__":
    main()
