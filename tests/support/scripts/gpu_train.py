"""A DDP training script written for GPUs, as a team launches it with torchrun on one GPU per rank, and its CPU twin.

``--style gpu`` (the default) is the GPU trainer: ``torch.cuda.set_device(local_rank)``, ``init_process_group("nccl")``,
``model.cuda()``, ``DistributedDataParallel(device_ids=[local_rank], output_device=local_rank)``, a ``DataLoader``
with ``pin_memory=True`` whose batches are pinned and moved with ``.to(device, non_blocking=True)``, autocast and a
``GradScaler`` on "cuda", ``torch.cuda.synchronize()``/``empty_cache()``/``max_memory_allocated()``, and a resume
that loads its checkpoint with ``map_location=f"cuda:{local_rank}"``. ``--style cpu`` is its twin: the same
training with every one of those written for the CPU (gloo, no devices, no pinning, autocast off, the CPU's
GradScaler). No ddpfaults import.

``--strategy naive`` skips a batch with no samples (``continue``); ``fixed`` runs it with a zero loss. ``--resume``
checkpoints after every optimizer step into the working directory (model, optimizer, scaler, position, RNG) and
resumes from there. Prints its replica's digest at the end.
"""

import argparse
import hashlib
import itertools
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

EPOCHS, BATCH = 2, 4
CHECKPOINT = "ckpt.pt"


class ResumableSampler(DistributedSampler):
    """A ``DistributedSampler`` that starts ``start`` indices into its epoch."""

    start = 0

    def __iter__(self):
        return itertools.islice(super().__iter__(), self.start, None)

    def __len__(self):
        return super().__len__() - self.start


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--style", choices=("gpu", "cpu"), default="gpu")
    parser.add_argument("--strategy", choices=("naive", "fixed"), default="naive")
    parser.add_argument("--batches", type=int, default=4, help="batches per rank per epoch")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args()
    gpu = args.style == "gpu"
    local_rank = int(os.environ["LOCAL_RANK"])
    if gpu:
        assert torch.cuda.is_available() and torch.cuda.device_count() >= int(os.environ["LOCAL_WORLD_SIZE"])
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        dist.init_process_group("nccl")
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    generator = torch.Generator().manual_seed(1)
    samples = BATCH * args.batches * world_size
    dataset = TensorDataset(torch.randn(samples, 8, generator=generator), torch.randn(samples, 1, generator=generator))
    sampler = ResumableSampler(dataset, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=BATCH, sampler=sampler, pin_memory=gpu)
    per_epoch = len(loader)
    torch.manual_seed(0)
    torch.cuda.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Dropout(0.25), torch.nn.Linear(16, 1))
    if gpu:
        model = model.cuda()
        ddp = DistributedDataParallel(model, device_ids=[local_rank], output_device=local_rank)
    else:
        ddp = DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cuda" if gpu else "cpu")
    done, state = 0, None
    if args.resume and os.path.exists(CHECKPOINT):
        state = torch.load(CHECKPOINT, map_location=f"cuda:{local_rank}" if gpu else "cpu", weights_only=False)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scaler.load_state_dict(state["scaler"])
        done = state["done"]
    step = done
    for epoch in range(done // per_epoch, args.epochs):
        sampler.set_epoch(epoch)
        resuming = state is not None and epoch == done // per_epoch
        skip = done - epoch * per_epoch if resuming else 0
        sampler.start = skip * BATCH
        if resuming and skip == 0:
            torch.set_rng_state(state["torch"])
        batches = iter(loader)  # making an iterator draws from torch's RNG
        if resuming and skip > 0:
            torch.set_rng_state(state["torch"])
        for x, y in batches:
            if gpu:
                x, y = x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
            if len(x) == 0:
                if args.strategy == "naive":
                    continue
                with torch.autocast(device.type, dtype=torch.float16, enabled=gpu):
                    loss = ddp(x).sum() * 0.0
            else:
                with torch.autocast(device.type, dtype=torch.float16, enabled=gpu):
                    loss = torch.nn.functional.mse_loss(ddp(x).float(), y)
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            step += 1
            if args.resume and rank == 0:
                saved = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "done": step}
                saved.update(scaler=scaler.state_dict(), torch=torch.get_rng_state())
                torch.save(saved, CHECKPOINT + ".tmp")
                os.replace(CHECKPOINT + ".tmp", CHECKPOINT)
        sampler.start = 0
    if gpu:
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() / 2**20
        torch.cuda.empty_cache()
        print(f"rank {rank} peak CUDA memory {peak:.1f} MiB on {torch.cuda.get_device_name()}", flush=True)
    replica = hashlib.sha256(b"".join(p.detach().cpu().numpy().tobytes() for p in model.parameters())).hexdigest()
    print(f"rank {rank} after {step} steps replica digest: {replica}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
