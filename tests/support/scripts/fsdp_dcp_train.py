"""A plain torchrun training script with FSDP2 and DCP, no ddpfaults import: a 1-D CPU mesh, ``fully_shard`` per layer
and on the root, DataLoader + DistributedSampler, SGD; then ``dcp.save``, ``dcp.load`` into a fresh model, a closing
``dist.barrier()``. Prints ``digest <sha256>`` of the gathered full state (equal on every rank, and equal after the
round trip, or it raises).

A rank whose batch is empty ``continue``s (skips forward, backward and step), as report 000's freeze did: its
all-gathers and reduce-scatters pair with its peers' next step without error, and the world hangs at the end.
``--empty-rank R --empty-batch B``: that rank's batch B is itself empty (no injected fault).
"""

import argparse
import hashlib
import os
import tempfile

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def build(mesh, seed):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def digest(model):
    h = hashlib.sha256()
    for name, p in model.named_parameters():
        h.update(name.encode() + p.full_tensor().detach().numpy().tobytes())
    return h.hexdigest()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", type=int, default=5, help="batches per rank")
    parser.add_argument("--empty-rank", type=int, default=None)
    parser.add_argument("--empty-batch", type=int, default=None)
    parser.add_argument("--checkpoint", default=None, help="the DCP checkpoint directory (default: a fresh one)")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world_size,))
    torch.manual_seed(0)
    samples = 4 * args.batches * world_size
    data = TensorDataset(torch.randn(samples, 8), torch.randn(samples, 1))
    loader = DataLoader(data, batch_size=4, sampler=DistributedSampler(data, shuffle=False))
    model = build(mesh, seed=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for i, (x, y) in enumerate(loader):
        if rank == args.empty_rank and i == args.empty_batch:
            x, y = x[:0], y[:0]
        if len(x) == 0:
            continue
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    path = [args.checkpoint or (tempfile.mkdtemp(prefix="fsdp-dcp-") if rank == 0 else None)]
    dist.broadcast_object_list(path, src=0)
    dcp.save({"model": model.state_dict()}, checkpoint_id=path[0])
    restored = build(mesh, seed=1)
    state = {"model": restored.state_dict()}
    dcp.load(state, checkpoint_id=path[0])
    restored.load_state_dict(state["model"])
    before, after = digest(model), digest(restored)
    if before != after:
        raise RuntimeError(f"rank {rank}: the DCP round trip changed the state ({before} != {after})")
    print(f"digest {before}", flush=True)
    dist.barrier()
    if rank == 0 and not args.checkpoint:
        for name in os.listdir(path[0]):
            os.remove(os.path.join(path[0], name))
        os.rmdir(path[0])
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
