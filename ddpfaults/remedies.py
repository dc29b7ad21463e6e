"""The fixes from the field reports as small helpers to call in your own trainer.

Each one is proven by a fixed built-in scenario in a real gloo world:

- :func:`all_ranks_empty` — agree on emptiness across ranks before skipping anything (report 000);
- :func:`fake_targets` — zero-instance targets *derived* from a real target's schema (report 000);
- :func:`atomic_save` + :func:`load_after_barrier` — no rank ever reads a half-written checkpoint (report 002);
- :func:`ddp_wrap` — no ``device_ids`` for a CPU (or non-CUDA) module (report 004);
- :func:`even_batches` / :func:`join` — uneven inputs without a hang; :func:`training_census` — are all ranks
  training, on different samples (report 003)?
- :func:`any_rank_failed` — one rank's step failed (out of memory): every rank skips it together (issue 15).
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from ddpfaults.toy.data import PER_SCENE_FIELDS, fake_target_like


def empty_rank_count(is_empty: bool, *, group=None) -> int:
    """How many ranks have an empty batch: every rank must call this at the same point (one all_reduce)."""
    flag = torch.tensor([int(bool(is_empty))], dtype=torch.int64)
    dist.all_reduce(flag, group=group)
    return int(flag.item())


def all_ranks_empty(is_empty: bool, *, group=None) -> bool:
    """True only if every rank's batch is empty: then (and only then) all ranks may skip the step together."""
    return empty_rank_count(is_empty, group=group) == dist.get_world_size(group)


def fake_targets(reference: dict, scenes: list[dict]) -> list[dict]:
    """One zero-instance target per scene, derived from the real target ``reference``.

    Every key, dtype and trailing shape comes from ``reference`` (so the matcher finds every field it
    reads); the per-scene fields (``point2segment``) come from each scene's own target when it has them.
    """
    fakes = []
    for scene in scenes:
        fake = fake_target_like(reference)
        fake.update({key: scene[key] for key in PER_SCENE_FIELDS if key in scene})
        fakes.append(fake)
    return fakes


def atomic_save(obj, path: str) -> None:
    """``torch.save`` to a temp file in the same directory, fsync, then ``os.replace``: readers see the
    old file or the new one, never a torn one; a writer killed mid-save leaves the last good file."""
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def load_after_barrier(path: str, *, group=None, **load_kwargs):
    """Barrier, ``torch.load(path)``, barrier: every rank (the writer included) must call it.

    The first barrier waits for the writer's save; the second keeps a later save from replacing the
    file while a slow rank still reads it.
    """
    dist.barrier(group=group)
    state = torch.load(path, **load_kwargs)
    dist.barrier(group=group)
    return state


def ddp_kwargs(model: torch.nn.Module, local_device=None) -> dict:
    """The device arguments for DDP that fit where ``model``'s parameters really are.

    ``device_ids=[i]`` only for a module on exactly one CUDA device ``i``; ``{}`` for a CPU (or any
    non-CUDA) module, whatever device the launcher handed out in ``local_device``.
    """
    devices = {p.device for p in model.parameters()}
    if len(devices) == 1:
        (device,) = devices
        if device.type == "cuda":
            return {"device_ids": [device.index if device.index is not None else torch.device(local_device).index]}
    return {}


def ddp_wrap(model: torch.nn.Module, local_device=None, *, wrapper=None, **kwargs):
    """Wrap ``model`` in DDP with :func:`ddp_kwargs` (``wrapper`` defaults to DistributedDataParallel;
    pass ``ctx.ddp`` inside ddpfaults to keep the gradient all_reduces traced)."""
    wrapper = wrapper or torch.nn.parallel.DistributedDataParallel
    return wrapper(model, **ddp_kwargs(model, local_device), **kwargs)


def even_batches(batches, *, group=None) -> list:
    """The first N batches of this rank's ``batches``, N being the smallest count on any rank (drop-last
    across ranks): every rank runs the same number of steps, so no rank waits on a finished peer."""
    batches = list(batches)
    count = torch.tensor([len(batches)], dtype=torch.int64)
    dist.all_reduce(count, op=dist.ReduceOp.MIN, group=group)
    return batches[: int(count.item())]


def join(ddp_model, **kwargs):
    """``torch.distributed.algorithms.Join([ddp_model])``: ranks that run out of batches shadow the
    others' gradient all_reduces, and the final model is synchronised from the last rank to finish."""
    from torch.distributed.algorithms import Join

    return Join([ddp_model], **kwargs)


def training_census(steps: int, samples, *, group=None) -> dict:
    """Gather every rank's step count and sample ids (report 003's checks); identical on every rank.

    Returns ``{"steps": [per rank], "samples": [count per rank], "overlap": ids seen by more than one
    rank, "covered": distinct ids seen}``. With a proper DistributedSampler ``overlap`` is 0.
    """
    gathered = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, (int(steps), sorted(int(s) for s in samples)), group=group)
    seen: dict = {}
    for _, ids in gathered:
        for i in set(ids):
            seen[i] = seen.get(i, 0) + 1
    return {
        "steps": [s for s, _ in gathered],
        "samples": [len(ids) for _, ids in gathered],
        "overlap": sum(1 for n in seen.values() if n > 1),
        "covered": len(seen),
    }


def any_rank_failed(failed: bool, *, group=None) -> bool:
    """True if any rank's step failed (e.g. it caught an out-of-memory error): then every rank skips the step
    together, so no rank is left alone in the step's collectives. Every rank must call it at the same point (one
    all_reduce, :func:`empty_rank_count`'s)."""
    return empty_rank_count(failed, group=group) > 0
