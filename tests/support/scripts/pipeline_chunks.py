"""A plain torchrun-style script, no ddpfaults import: a pipeline by hand, each rank a stage, GPipe's order (every
microbatch forward, then every one backward) over blocking ``send``/``recv``. Stage 0 holds the data and cuts each
step's batch into microbatches with ``batch.chunk(MICROBATCHES)``; the other stages receive ``MICROBATCHES`` a step.
``--short-step S``: stage 0's batch at step S holds 6 rows, not 8, and ``chunk(4)`` of 6 rows gives 3 microbatches
of 2 rows (a last batch cut short): stage 0 sends one activation fewer and waits for its gradients, while stage 1
waits for the activation never sent. An optimizer step counts each step."""

import argparse

import torch
import torch.distributed as dist

#: microbatches a step, and rows and features of each
MICROBATCHES, ROWS, WIDTH = 4, 2, 8


def batch_of(step: int, short_step) -> torch.Tensor:
    """Stage 0's batch at ``step``: ``MICROBATCHES * ROWS`` rows, two fewer at ``short_step``."""
    rows = MICROBATCHES * ROWS - (ROWS if step == short_step else 0)
    return torch.full((rows, WIDTH), float(step))


def pipeline_step(rank: int, size: int, batch: torch.Tensor | None) -> float:
    """One step of stage ``rank`` of ``size``: its microbatches forward (stage 0 cuts ``batch``), then backward."""
    chunks = list(batch.chunk(MICROBATCHES)) if rank == 0 else [torch.empty(ROWS, WIDTH) for _ in range(MICROBATCHES)]
    for x in chunks:
        if rank > 0:
            dist.recv(x, src=rank - 1)
        if rank < size - 1:
            dist.send(x + 1, dst=rank + 1)
    total = 0.0
    for x in chunks:
        grad = torch.ones(ROWS, WIDTH) if rank == size - 1 else torch.empty(ROWS, WIDTH)
        if rank < size - 1:
            dist.recv(grad, src=rank + 1)
        if rank > 0:
            dist.send(grad, dst=rank - 1)
        total += float((grad * x).sum())
    return total


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--short-step", type=int)
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    weight = torch.nn.Parameter(torch.ones(1))
    optimizer = torch.optim.SGD([weight], lr=0.1)
    for step in range(args.steps):
        pipeline_step(rank, size, batch_of(step, args.short_step) if rank == 0 else None)
        weight.grad = torch.ones(1)
        optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
