"""Module-level rank functions for the property tests (tests/scenarios/test_properties.py) and their benchmark.

Kept apart from the test module on purpose: a rank process imports the module of the function it
runs, and the test module imports hypothesis and pytest (about 0.3 s more per cold 4-rank world on
two cores, measured). This module imports only torch and ddpfaults.
"""

import json
import os

import torch
import torch.distributed as dist

from ddpfaults import remedies
from ddpfaults.toy.data import make_batch, stack_point2segment
from ddpfaults.toy.models import MLP, SetCriterion, SetPredictionModel, regression_step, state_digest


def reference_training(ctx, empty, steps=3, mode="instances"):
    """The oracle of property 1: the empty-batch scenario's training, with emptiness known from the plan.

    ``empty`` is a collection of ``(rank, step)`` cells. ``mode="instances"``: an empty cell's batch
    is generated empty at the source (``make_batch(empty=True)``: same points, zero instances) and
    trained with the plain criterion; a step on which every rank is empty is skipped by all ranks
    (decided from the plan, no collective). ``mode="zero_loss"`` (measured, not asserted): an empty
    cell's loss is multiplied by 0, so its gradient is exactly zero. No fault, no agreement
    collective, no fake-target remedy. Returns ``(digest, state dict)``.
    """
    cells = {(int(r), int(s)) for r, s in empty}
    model = SetPredictionModel(seed=ctx.seed)
    ddp = ctx.ddp(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    criterion = SetCriterion()
    for step in range(steps):
        ctx.step(step)
        empty_ranks = {r for r, s in cells if s == step}
        if len(empty_ranks) == ctx.world_size:
            continue
        is_empty = ctx.rank in empty_ranks
        points, targets = make_batch(seed=ctx.seed, rank=ctx.rank, step=step, empty=is_empty and mode == "instances")
        outputs = ddp(points, stack_point2segment(targets))
        loss = criterion(outputs, targets)
        if is_empty and mode == "zero_loss":
            loss = loss * 0
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return state_digest(model), {k: v.detach().clone() for k, v in model.state_dict().items()}


def _append(path, record):
    """Append one JSON line durably (a rank killed afterwards loses nothing written)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (json.dumps(record) + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def _probe(path):
    """What a restarted job finds on disk: ``absent``, the digest of a loadable checkpoint, or ``torn: ...``."""
    if not os.path.exists(path):
        return "absent"
    try:
        return state_digest(torch.load(path))
    except Exception as exc:  # the probe reports what a restart would meet
        return f"torn: {type(exc).__name__}: {exc}"[:200]


def _is_peer_loss(exc):
    text = str(exc)
    return "Connection closed by peer" in text or "Connection reset by peer" in text


def checkpoint_protocol(ctx, log_dir, save="atomic", sync="commit", steps=3):
    """Train an MLP; after every step rank 0 saves a checkpoint and every other rank loads it.

    The FIXED protocol (``save="atomic", sync="commit"``): ``remedies.atomic_save`` (temp file, fsync,
    ``os.replace``), then the writer tells each reader point to point that the save is complete
    (``isend``; the readers ``recv``), then each reader loads. A reader whose ``recv`` fails because
    the writer died probes the checkpoint on disk, as a restarted job would, and returns.
    The NAIVE protocol (``save="inplace", sync="none"``): ``torch.save`` in place, readers load at once.

    Records go to ``log_dir`` (outside the world, so they survive any rank's death): the writer appends
    ``{"step", "digest"}`` to ``saves.jsonl`` only once a save has returned; each reader appends
    ``{"step", "kind": "load"|"probe"|"failed", "got", "replica"}`` to ``rank{r}.jsonl`` (``replica``:
    the digest of its own model at that step, bit-equal to the writer's under DDP).
    """
    model = MLP(seed=ctx.seed)
    ddp = ctx.ddp(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    path = os.path.join(ctx.shared_dir, "ckpt.pth")
    os.makedirs(log_dir, exist_ok=True)
    mine = os.path.join(log_dir, f"rank{ctx.rank}.jsonl")
    for step in range(steps):
        regression_step(ctx, ddp, optimizer, step)
        replica = state_digest(model)
        if ctx.rank == 0:
            state = {k: v.detach().clone() for k, v in model.state_dict().items()}
            if save == "atomic":
                remedies.atomic_save(state, path)
            else:
                torch.save(state, path)
            _append(os.path.join(log_dir, "saves.jsonl"), {"step": step, "digest": state_digest(state)})
            if sync == "commit":
                # the writer's sends are not counted by TornCheckpointWrite's handshake, a reader's recv is: a
                # reader waiting here releases the writer's held save (counted, three isends against one recv
                # per reader held a second torn step the 30 s handshake limit: measured)
                for work in [dist.isend(torch.ones(1), dst=r) for r in range(1, ctx.world_size)]:
                    work.wait()
            continue
        try:
            if sync == "commit":
                dist.recv(torch.zeros(1), src=0)
        except RuntimeError as exc:
            if not _is_peer_loss(exc):
                raise
            _append(mine, {"step": step, "kind": "probe", "got": _probe(path), "replica": replica})
            return "writer lost"
        try:
            got, kind = state_digest(torch.load(path)), "load"
        except Exception as exc:  # a torn read: recorded, so the property names it
            got, kind = f"{type(exc).__name__}: {exc}"[:200], "failed"
        _append(mine, {"step": step, "kind": kind, "got": got, "replica": replica})
    return "done"


def gather_sums(ctx, sizes):
    """For each size: this rank's random flat tensor (values over six orders of magnitude) and gloo's all_reduce
    of it over the world, to check ``ddp_oracle.ring_allreduce`` against."""
    out = []
    for n in sizes:
        generator = torch.Generator().manual_seed(1000 * n + ctx.rank)
        mine = torch.randn(n, generator=generator) * torch.logspace(-3, 3, n)
        summed = mine.clone()
        dist.all_reduce(summed)
        out.append((mine, summed))
    return out
