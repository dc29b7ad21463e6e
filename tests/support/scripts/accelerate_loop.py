"""An Accelerate training loop, no ddpfaults import: ``Accelerator(cpu=True)`` makes the gloo process group from
torchrun's environment (or takes the one already made), ``prepare`` wraps the model in DDP and the DataLoader in
accelerate's ``DataLoaderShard`` (which fetches one batch ahead), a rank whose batch is empty ``continue``s (no
forward, backward or step), and every rank meets at a closing ``accelerator.wait_for_everyone()``.

``--empty-rank R --empty-batch B``: that rank's batch B is itself empty (no injected fault).
``accelfns.accelerate_loop`` runs :func:`train` as a rank function.
"""

import argparse

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset


def train(batches: int = 5, empty_rank=None, empty_batch=None, announce=lambda step: None) -> Accelerator:
    """Train ``batches`` batches per rank (``announce(i)`` as batch ``i`` begins); return the accelerator."""
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    samples = 4 * batches * accelerator.num_processes
    data = TensorDataset(torch.randn(samples, 8), torch.randn(samples, 1))
    model = torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer, loader = accelerator.prepare(model, optimizer, DataLoader(data, batch_size=4))
    for i, (x, y) in enumerate(loader):
        announce(i)
        if accelerator.process_index == empty_rank and i == empty_batch:
            x, y = x[:0], y[:0]
        if len(x) == 0:
            continue
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        accelerator.backward(loss)
        optimizer.step()
    accelerator.wait_for_everyone()
    return accelerator


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", type=int, default=5, help="batches per rank")
    parser.add_argument("--empty-rank", type=int, default=None)
    parser.add_argument("--empty-batch", type=int, default=None)
    args = parser.parse_args()
    train(args.batches, args.empty_rank, args.empty_batch).end_training()
