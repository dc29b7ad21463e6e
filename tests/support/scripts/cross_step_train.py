"""A plain torchrun script, no ddpfaults import, that averages its gradients itself: one all_reduce of the flattened
gradients per step, then SGD. ``--skip-rank R --skip-step S``: that rank skips its reduction at step S (as a
``continue`` past a bad batch after backward would) and makes one more after its loop (a closing sync): every
rank makes as many same-size all_reduces, so the world completes, and from step S on each of rank R's steps is
averaged with its peers' next step. ``--sends N``: first, rank 0 sends each peer N tensors
(``batch_isend_irecv``)."""

import argparse

import torch
import torch.distributed as dist


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--skip-rank", type=int, default=None)
    parser.add_argument("--skip-step", type=int, default=3)
    parser.add_argument("--sends", type=int, default=0)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if args.sends:
        t, size = torch.ones(2), dist.get_world_size()
        if rank == 0:
            ops = [dist.P2POp(dist.isend, t, peer) for peer in range(1, size) for _ in range(args.sends)]
        else:
            ops = [dist.P2POp(dist.irecv, torch.empty(2), 0) for _ in range(args.sends)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    torch.manual_seed(1 + rank)
    for step in range(args.steps):
        loss = model(torch.randn(4, 8)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        if not (rank == args.skip_rank and step == args.skip_step):
            flat = torch.cat([p.grad.flatten() for p in model.parameters()])
            dist.all_reduce(flat)
        optimizer.step()
    if rank == args.skip_rank:
        dist.all_reduce(torch.zeros(sum(p.numel() for p in model.parameters())))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
