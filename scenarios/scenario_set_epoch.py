"""``DistributedSampler.set_epoch`` forgotten: every epoch replays the same order — a silent bug.

Measured on gloo (what the variants assert):

- ``naive``: a shuffling ``DistributedSampler`` whose ``set_epoch`` is never called. The world completes
  with bit-equal replicas and no error anywhere; the returned record shows every epoch visiting each
  rank's samples in the very same order (the sampler reseeds with ``seed + 0`` every epoch). The order is
  shuffled (not 0, 1, 2, ...) and the ranks' shards stay disjoint and cover the dataset: what is lost is
  the reshuffle between epochs, nothing else.
- ``fixed``: ``sampler.set_epoch(epoch)`` before each epoch: every epoch has its own order, the shards of
  each epoch are disjoint and cover the dataset (:func:`ddpfaults.remedies.training_census`), replicas
  bit-equal.

Field claims the measurements contradict: that without ``set_epoch`` "the data is not shuffled at all"
(it is shuffled, once, then that order repeats), and that ranks then "see the same samples" (their
shards stay disjoint: overlap 0 every epoch). The bug shows only in the orders across epochs, so
both variants complete and a check over the returned orders tells them apart.
"""

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import ddpfaults
from _checks import SAFE_STALL, expect, value_check
from ddpfaults import remedies
from ddpfaults.toy.data import make_regression
from ddpfaults.toy.models import MLP, state_digest

DATASET = 16
BATCH = 2
EPOCHS = 3
WORLD = 2


def _orders(values):
    """Per epoch, the tuple of every rank's sample order (rank 0's record: the ranks gathered the same one)."""
    return [tuple(tuple(order) for order in epoch["orders"]) for epoch in values[0]["epochs"]]


def _disjoint_cover(values) -> bool:
    """Every epoch's shards are disjoint and cover the dataset, with the same step count on every rank."""
    return all(
        e["census"]["overlap"] == 0 and e["census"]["covered"] == DATASET and len(set(e["census"]["steps"])) == 1
        for e in values[0]["epochs"]
    )


def _shuffled(values) -> bool:
    """The first epoch's order is not the dataset's own order (the sampler does shuffle)."""
    first = [i for order in _orders(values)[0] for i in order]
    return sorted(first) == list(range(DATASET)) and first != sorted(first)


SAME_ORDER = value_check(
    f"every one of {EPOCHS} epochs replayed the same shuffled order; shards disjoint and covering",
    lambda values: (
        values[0] is not None and len(set(_orders(values))) == 1 and _shuffled(values) and _disjoint_cover(values)
    ),
)
NEW_ORDER = value_check(
    f"each of {EPOCHS} epochs had its own order; shards disjoint and covering every epoch",
    lambda values: values[0] is not None and len(set(_orders(values))) == EPOCHS and _disjoint_cover(values),
)


@ddpfaults.scenario(
    world_size=WORLD,
    stall=SAFE_STALL,
    variants=[
        ddpfaults.variant(
            "naive", kwargs={"call_set_epoch": False}, expect=expect("completed", SAME_ORDER, values_equal=True)
        ),
        ddpfaults.variant(
            "fixed", kwargs={"call_set_epoch": True}, expect=expect("completed", NEW_ORDER, values_equal=True)
        ),
    ],
)
def set_epoch(ctx, call_set_epoch):
    """Train an MLP for a few epochs over a shuffling DistributedSampler; return, identical on every rank,
    each epoch's per-rank sample order and census, and the model digest."""
    x, y = make_regression(seed=ctx.seed, rank=0, step=0, batch_size=DATASET)
    dataset = TensorDataset(torch.arange(DATASET), x, y)
    sampler = DistributedSampler(dataset, shuffle=True, seed=ctx.seed)
    loader = DataLoader(dataset, batch_size=BATCH, sampler=sampler)
    model = MLP(seed=ctx.seed)
    ddp = ctx.ddp(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    epochs, step = [], 0
    for epoch in range(EPOCHS):
        if call_set_epoch:
            sampler.set_epoch(epoch)
        order = []
        for ids, xb, yb in loader:
            ctx.step(step)
            loss = F.mse_loss(ddp(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            order += ids.tolist()
            step += 1
        orders = [None] * dist.get_world_size()
        dist.all_gather_object(orders, order)
        epochs.append({"orders": orders, "census": remedies.training_census(len(order) // BATCH, order)})
    return {"epochs": epochs, "digest": state_digest(model)}
