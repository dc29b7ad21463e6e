"""A torchrun training script that checkpoints after every optimizer step into its working directory and resumes
from there: DDP, a shuffling ``DistributedSampler`` under a ``DataLoader``, dropout, SGD with momentum, a random
input scaling drawn from Python's ``random``. No ddpfaults import.

``--lose nothing`` restores everything: model, optimizer, step count, the position in the epoch (a sampler that
starts past the batches already consumed, so none is drawn again), torch's RNG (after the iterator a mid-epoch resume
makes, before the one an epoch start makes: making an iterator draws from it) and ``random``'s state.
``--lose position`` restarts the epoch's data from its beginning (only the epoch is restored);
``--lose random`` restores torch's RNG but not ``random``'s. Prints its replica's digest at the end.
"""

import argparse
import hashlib
import itertools
import os
import random

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

EPOCHS, SAMPLES, BATCH = 2, 24, 3
CHECKPOINT = "ckpt.pt"


class ResumableSampler(DistributedSampler):
    """A ``DistributedSampler`` that starts ``start`` indices into its epoch (the samples a resumed run already
    consumed are not drawn again)."""

    start = 0

    def __iter__(self):
        return itertools.islice(super().__iter__(), self.start, None)

    def __len__(self):
        return super().__len__() - self.start


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--lose", choices=("nothing", "position", "random"), default="nothing")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    generator = torch.Generator().manual_seed(1)
    dataset = TensorDataset(torch.randn(SAMPLES, 4, generator=generator), torch.randn(SAMPLES, 1, generator=generator))
    sampler = ResumableSampler(dataset, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=BATCH, sampler=sampler)
    per_epoch = len(loader)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Dropout(0.5), torch.nn.Linear(16, 1))
    ddp = DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    state = torch.load(CHECKPOINT, weights_only=False) if os.path.exists(CHECKPOINT) else None
    done = 0
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        done = state["done"]
        if args.lose != "random":
            random.setstate(state["random"])
    for epoch in range(done // per_epoch, EPOCHS):
        sampler.set_epoch(epoch)
        resuming = state is not None and epoch == done // per_epoch
        skip = done - epoch * per_epoch if resuming and args.lose != "position" else 0
        sampler.start = skip * BATCH
        if resuming and skip == 0:
            torch.set_rng_state(state["torch"])
        batches = iter(loader)
        if resuming and skip > 0:
            torch.set_rng_state(state["torch"])
        for i, (x, y) in enumerate(batches):
            step = epoch * per_epoch + skip + i
            x = x * random.uniform(0.8, 1.2)
            loss = torch.nn.functional.mse_loss(ddp(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if dist.get_rank() == 0:
                saved = {"model": model.state_dict(), "optimizer": opt.state_dict(), "done": step + 1}
                torch.save({**saved, "torch": torch.get_rng_state(), "random": random.getstate()}, CHECKPOINT + ".tmp")
                os.replace(CHECKPOINT + ".tmp", CHECKPOINT)
        sampler.start = 0
    replica = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()
    print(f"replica digest: {replica}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
