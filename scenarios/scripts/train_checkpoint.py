"""The checkpoint race as a torchrun training script: rank 0 saves ``best_stg1.pth`` after step 1, every rank
reloads its EMA copy from it. No ddpfaults calls: ``TornCheckpointWrite`` acts on the checkpoint file on disk.

``--save inplace --sync none`` is the field's code; ``--save atomic --sync barrier`` the fix (temp file and
``os.replace``, barrier, load, barrier); ``--sync rank0`` the barrier indented under ``if rank == 0``.
"""

import argparse
import os
import tempfile
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from ddpfaults import remedies
from ddpfaults.toy.models import MLP, state_digest


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--save", choices=("inplace", "atomic"), default="atomic")
    parser.add_argument("--sync", choices=("none", "barrier", "rank0"), default="barrier")
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    directory = os.path.join(tempfile.gettempdir(), f"ckpt-{os.environ.get('TORCHELASTIC_RUN_ID', 'local')}")
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "best_stg1.pth")
    model, ema = MLP(seed=0), MLP(seed=1)
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(rank)
    for step in range(args.steps):
        x, y = torch.randn(8, 8, generator=generator), torch.randn(8, 2, generator=generator)
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step != 1:
            continue
        if rank == 0:
            state = {k: v.clone() for k, v in model.state_dict().items()}
            torch.save(state, path) if args.save == "inplace" else remedies.atomic_save(state, path)
        if args.sync == "barrier":
            ema.load_state_dict(remedies.load_after_barrier(path))
            continue
        if args.sync == "rank0" and rank == 0:
            dist.barrier()  # the bug: only rank 0 reaches this barrier
        while not os.path.exists(path):
            time.sleep(0.005)
        ema.load_state_dict(torch.load(path))
    print(f"replica digest: {state_digest(ema)}", flush=True)
    dist.barrier()
    if rank == 0:
        os.remove(path)
        os.rmdir(directory)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
