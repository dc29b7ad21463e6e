"""The empty-batch scenario as a trainer written for GPUs, launched with torchrun on one GPU per rank: no ddpfaults
calls, no CPU path. Run with ``cuda_on_cpu`` (``--cuda-on-cpu``), it runs unmodified on CPU ranks.

``torch.cuda.set_device(local_rank)``, ``init_process_group("nccl")``, ``model.cuda()``, DDP with
``device_ids=[local_rank]``, a ``DataLoader`` with ``pin_memory=True`` whose batches move with
``.to(device, non_blocking=True)``, autocast and a ``GradScaler`` on "cuda". ``--strategy naive`` skips a batch with
no samples (``continue``: no forward, no backward, no optimizer step); ``fixed`` runs it with a zero loss over the
whole graph, so its gradient all_reduce still happens. ``--side-stream`` overlaps the batch copy on a CUDA stream,
which has no CPU meaning. Prints its replica's digest at the end.
"""

import argparse
import hashlib
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--strategy", choices=("naive", "fixed"), default="naive")
    parser.add_argument("--side-stream", action="store_true")
    parser.add_argument("--batches", type=int, default=4)
    args = parser.parse_args()
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    dist.init_process_group("nccl")
    samples = 4 * args.batches * dist.get_world_size()
    generator = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(samples, 8, generator=generator), torch.randn(samples, 1, generator=generator))
    sampler = DistributedSampler(data, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=4, sampler=sampler, pin_memory=True)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)).cuda()
    ddp = DistributedDataParallel(model, device_ids=[local_rank], output_device=local_rank)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cuda")
    copies = torch.cuda.Stream() if args.side_stream else None
    for x, y in loader:
        if copies is not None:
            with torch.cuda.stream(copies):
                x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            torch.cuda.current_stream().wait_stream(copies)
        else:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        if len(x) == 0 and args.strategy == "naive":
            continue
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = ddp(x)
            loss = out.sum() * 0.0 if len(x) == 0 else torch.nn.functional.mse_loss(out.float(), y)
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    torch.cuda.synchronize()
    digest = hashlib.sha256(b"".join(p.detach().cpu().numpy().tobytes() for p in model.parameters())).hexdigest()
    print(f"replica digest: {digest}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
