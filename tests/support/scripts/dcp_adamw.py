"""A plain torchrun script, no ddpfaults import: FSDP2 (a 1-D CPU mesh, ``fully_shard`` per layer and on the
root) trains ``--steps`` steps with AdamW, saves the model's and the optimizer's state with DCP
(``get_state_dict``), then loads both into a fresh model and optimizer. AdamW's step counters are replicated on
every rank and DCP stores them once, in one rank's file: a torn file fails every rank's load."""

import argparse
import tempfile

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard


def build(mesh, seed):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    model = fully_shard(model, mesh=mesh)
    return model, torch.optim.AdamW(model.parameters(), lr=0.01)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    model, optimizer = build(mesh, seed=0)
    torch.manual_seed(1 + rank)
    for _ in range(args.steps):
        loss = model(torch.randn(4, 8)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    path = [tempfile.mkdtemp(prefix="dcp-adamw-") if rank == 0 else None]
    dist.broadcast_object_list(path, src=0)
    model_state, optim_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=path[0])
    fresh, fresh_optimizer = build(mesh, seed=1)
    model_state, optim_state = get_state_dict(fresh, fresh_optimizer)
    state = {"model": model_state, "optim": optim_state}
    dcp.load(state, checkpoint_id=path[0])
    set_state_dict(fresh, fresh_optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
