"""A plain torchrun training script, no ddpfaults import: DataLoader + DistributedSampler + DDP + AdamW, and
rank 0 saves a checkpoint at the end.

``--strategy naive`` skips a batch with no samples (``continue``: no forward, no backward, no optimizer
step); ``fixed`` runs it with a zero loss over the whole graph, so its gradient all_reduce still happens.
``--empty-rank R --empty-step S`` makes the script empty that batch itself: how the ground truth is
measured under plain ``torchrun``, where no ddpfaults fault exists. ``--exit-on-notice CODE``: a SIGTERM handler
that ends the rank with ``sys.exit(CODE)``, as a trainer's that cleans up and exits does.
"""

import argparse
import signal
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--strategy", choices=("naive", "fixed"), default="naive")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batches", type=int, default=4, help="batches per rank per epoch")
    parser.add_argument("--checkpoint", default=None, help="where rank 0 saves (default: none)")
    parser.add_argument("--empty-rank", type=int, default=None)
    parser.add_argument("--empty-step", type=int, default=None)
    parser.add_argument("--exit-on-notice", type=int, default=None)
    args = parser.parse_args()
    if args.exit_on_notice is not None:
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(args.exit_on_notice))

    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    samples = 4 * args.batches * world_size
    data = TensorDataset(torch.randn(samples, 8), torch.randn(samples, 1))
    sampler = DistributedSampler(data, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=4, sampler=sampler)
    model = DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    step = 0
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            if rank == args.empty_rank and step == args.empty_step:
                x, y = x[:0], y[:0]
            if len(x) == 0:
                if args.strategy == "naive":
                    continue
                loss = model(x).sum() * 0.0
            else:
                loss = torch.nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
    if rank == 0 and args.checkpoint:
        torch.save(model.module.state_dict(), args.checkpoint)
    print(f"rank {rank} done after {step} steps", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
