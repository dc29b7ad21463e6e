"""A tiny sharded model for the FSDP2 and DCP scenarios: a seeded MLP under ``fully_shard`` on a 1-D CPU mesh, its
regression data through a real ``DataLoader`` (so data faults reach it through the loader seam), and its full state.

:func:`full_state` gathers every parameter's DTensor (a collective on every rank): the invariant the scenarios check
is that it is equal across ranks, and equal after a DCP round trip.
"""

from __future__ import annotations

import torch
from torch import nn

from ddpfaults.toy.models import _seeded, state_digest

#: the Linear layers' (in, out) sizes
LAYERS = ((8, 16), (16, 16), (16, 1))


def sharded_mlp(world_size: int, *, seed: int = 0, per_layer: bool = True, reshard: bool = True) -> nn.Module:
    """A seeded MLP under FSDP2: ``fully_shard`` on each Linear (``per_layer``) and on the root, on a 1-D CPU mesh of
    ``world_size`` ranks (``reshard``: ``reshard_after_forward``). Same seed, same weights on every rank."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    with _seeded(seed):
        layers: list[nn.Module] = []
        for i, (n_in, n_out) in enumerate(LAYERS):
            layers += [nn.Linear(n_in, n_out)] + ([nn.ReLU()] if i < len(LAYERS) - 1 else [])
        model = nn.Sequential(*layers)
    mesh = init_device_mesh("cpu", (world_size,))
    if per_layer:
        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh, reshard_after_forward=reshard)
    return fully_shard(model, mesh=mesh, reshard_after_forward=reshard)


def regression_loader(*, seed: int, rank: int, batches: int, batch_size: int = 4) -> torch.utils.data.DataLoader:
    """A DataLoader of ``batches`` batches of ``(x [batch_size, 8], y [batch_size, 1])``, different on every rank."""
    generator = torch.Generator().manual_seed(seed * 1000 + rank)
    x = torch.randn(batches * batch_size, LAYERS[0][0], generator=generator)
    y = torch.randn(batches * batch_size, 1, generator=generator)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=batch_size)


def full_state(model: nn.Module) -> dict:
    """Every parameter's full (gathered) tensor, by name: a collective on every rank of the mesh."""
    return {name: p.full_tensor().detach().clone() for name, p in model.named_parameters()}


def full_digest(model: nn.Module) -> str:
    """The digest of :func:`full_state` (a collective): equal on every rank when the replicas' shards agree."""
    return state_digest(full_state(model))
