"""Property 1's oracle in one process, bit-equal to a 4-rank gloo DDP world: DDP's bucket order, gloo's ring sum.

A reference DDP world (``property_rankfns.reference_training``) costs a second 4-rank world per example, ~13 gloo
collectives at ~5 ms each on this machine. The same arithmetic in one process gives the same bits once three
things are done as the world does them:

* every rank's gradient is its own ``loss.backward()`` (the criterion's ``num_masks`` all_reduce sums integer
  counts: exact in any order);
* DDP puts the gradients, divided by the world size (exact: a power of two), into one flat bucket: in parameter
  order on the first iteration that runs backward, then in the order the gradients became ready in that
  iteration (DDP rebuilds its buckets from rank 0's order; the toy model's 2757 parameters fit one bucket);
* gloo's ring allreduce sums each element in a fixed order that depends on where the element sits in the
  bucket (:func:`ring_allreduce`).

``tests/scenarios/test_properties.py`` checks both halves against real worlds: the ring sum against gloo's
all_reduce on several sizes and world sizes, and the whole oracle against the reference world's digests.
"""

from __future__ import annotations

import torch

from ddpfaults.toy.data import make_batch, stack_point2segment
from ddpfaults.toy.models import SetCriterion, SetPredictionModel


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def ring_allreduce(tensors: list[torch.Tensor]) -> torch.Tensor:
    """The sum of ``tensors`` (rank r's flat tensor at index r) as gloo's ring allreduce computes it.

    gloo splits the buffer into ``2 * world_size`` segments (rounded to whole elements; larger buffers than
    this test uses would have more), ``2`` per rank; the segments of chunk ``c`` start their reduction on rank
    ``c - 1`` and travel down the ring, each rank adding its own value to the partial sum it received:
    ``x[c] + (x[c+1] + (x[c+2] + x[c-1]))`` for 4 ranks, ranks modulo the world size.
    """
    world = len(tensors)
    flat = [t.reshape(-1) for t in tensors]
    n = flat[0].numel()
    if world == 1:
        return flat[0].clone()
    segments = 2 * world
    per_segment = _ceil_div(n, segments)
    out = torch.empty_like(flat[0])
    for chunk in range(world):
        lo, hi = min(n, 2 * chunk * per_segment), min(n, 2 * (chunk + 1) * per_segment)
        if lo == hi:
            continue
        start = (chunk - 1) % world
        acc = flat[start][lo:hi].clone()
        for k in range(1, world):
            acc = flat[(start - k) % world][lo:hi] + acc
        out[lo:hi] = acc
    return out


class _GlobalCount(SetCriterion):
    """The criterion with ``num_masks`` given (what its all_reduce and the division by the world size yield)."""

    def __init__(self, num_masks: torch.Tensor):
        super().__init__()
        self.num_masks = num_masks

    def _reduce_num_masks(self, num_masks):
        return torch.clamp(self.num_masks, min=1)


def _local_gradients(model, params, criterion, batch) -> tuple[list[torch.Tensor], list[int]]:
    """One rank's gradients of its loss, and the order (parameter indices) in which they became ready."""
    ready: list[int] = []
    hooks = [p.register_post_accumulate_grad_hook(lambda _, i=i: ready.append(i)) for i, p in enumerate(params)]
    try:
        for p in params:
            p.grad = None
        points, targets = batch
        criterion(model(points, stack_point2segment(targets)), targets).backward()
        return [p.grad for p in params], ready
    finally:
        for hook in hooks:
            hook.remove()


def oracle_state(seed: int, cells, *, world_size: int = 4, steps: int = 3) -> dict:
    """The state dict after ``steps`` SGD steps of the reference world, computed here, bit for bit.

    ``cells``: the ``(rank, step)`` cells whose batch has zero instances (``make_batch(empty=True)``); a step on
    which every rank is empty is skipped by every rank. ``num_masks`` is ``max(1, total instances / world_size)``.
    Computed with one torch thread, as a rank computes (with two, some matrix products round differently).
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _train(seed, cells, world_size, steps)
    finally:
        torch.set_num_threads(threads)


#: (seed, world size, the cells of steps before ``s``, ``s``) -> (state dict, bucket order, rebuilt) before step
#: ``s``: drawn plans often share their first steps (15 distinct first steps among the 31 oracles of bench_properties)
_BEFORE_STEP: dict = {}


def _prefix(seed: int, world_size: int, cells: tuple, step: int) -> tuple:
    return seed, world_size, tuple(c for c in cells if c[1] < step), step


def _train(seed: int, cells, world_size: int, steps: int) -> dict:
    cells = tuple(sorted((int(r), int(s)) for r, s in cells))
    model = SetPredictionModel(seed=seed)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(params, lr=0.05)  # no momentum: the parameters are its whole state
    order = list(range(len(params)))  # the bucket before DDP rebuilds it
    rebuilt, start = False, 0
    for step in range(steps, 0, -1):  # resume after the longest prefix already trained
        known = _BEFORE_STEP.get(_prefix(seed, world_size, cells, step))
        if known is not None:
            state, order, rebuilt = known
            model.load_state_dict(state)
            start = step
            break
    for step in range(start, steps):
        empty = {r for r, s in cells if s == step}
        if len(empty) < world_size:
            order = _step(model, params, optimizer, seed, step, empty, world_size, order, rebuilt)
            rebuilt = True
        _BEFORE_STEP[_prefix(seed, world_size, cells, step + 1)] = (_state(model), order, rebuilt)
    return _state(model)


def _state(model) -> dict:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _step(model, params, optimizer, seed, step, empty, world_size, order, rebuilt) -> list:
    """One DDP step of every rank; the bucket order after it (rank 0's ready order, once DDP rebuilds)."""
    batches = [make_batch(seed=seed, rank=r, step=step, empty=r in empty) for r in range(world_size)]
    total = float(sum(len(t["labels"]) for _, targets in batches for t in targets))
    criterion = _GlobalCount(torch.tensor([total]) / world_size)
    buckets = []
    for rank, batch in enumerate(batches):
        grads, ready = _local_gradients(model, params, criterion, batch)
        if rank == 0 and not rebuilt:
            next_order = ready
        buckets.append(torch.cat([grads[i].reshape(-1) for i in order]).div_(world_size))
    summed = ring_allreduce(buckets)
    offset = 0
    for i in order:
        p = params[i]
        p.grad = summed[offset : offset + p.numel()].view_as(p).clone()
        offset += p.numel()
    optimizer.step()
    return order if rebuilt else next_order
