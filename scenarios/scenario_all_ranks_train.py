"""Report 003: "are all ranks training?" — every rank's step count and samples, in the result.

Measured on gloo (what the variants assert):

- ``no_sampler``: a plain DataLoader on every rank completes without an error, and every rank trains
  on the very same samples — the silent failure; the variant checks that the returned census shows
  it (overlap = the whole dataset).
- ``sampler``: a DistributedSampler gives each rank a disjoint shard that covers the dataset.
- ``uneven_naive``: rank 1's loader is shorter (``UnevenInputs``): it finishes while the others wait
  in the next DDP gradient all_reduce — a hang, named as rank 1 never calling it. Report 003 lists
  "some ranks get no data" / "a rank never enters the training loop" among the reasons logs show
  one rank only; under DDP such a rank does not idle quietly, it hangs every other rank.
- ``uneven_join`` / ``uneven_drop_last``: ``Join`` (the short rank shadows the others' all_reduces)
  or agreeing on the smallest batch count: both complete with bit-equal replicas.

Every completing variant returns the same census on every rank: steps and sample count per rank,
overlap, coverage, and the model digest.
"""

import contextlib

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import ddpfaults
from _checks import HANG_STALL, SAFE_STALL, expect, value_check
from ddpfaults import remedies
from ddpfaults.faults import UnevenInputs
from ddpfaults.toy.data import make_regression
from ddpfaults.toy.models import MLP, state_digest

DATASET = 32
BATCH = 2
SHORT = UnevenInputs(rank=1, batches=2)


def _census(predicate):
    return lambda values: values[0] is not None and predicate(values[0]["census"])


SAME_SAMPLES = value_check(
    "every rank trained on the same samples (overlap = whole dataset)",
    _census(lambda c: c["overlap"] == DATASET and c["samples"] == [DATASET] * 4),
)
DISJOINT = value_check(
    "disjoint shards covering the dataset, 4 steps per rank",
    _census(lambda c: c["overlap"] == 0 and c["covered"] == DATASET and c["steps"] == [4] * 4),
)
JOINED = value_check("steps per rank [4, 2, 4, 4] (rank 1 joined early)", _census(lambda c: c["steps"] == [4, 2, 4, 4]))
DROPPED = value_check(
    "steps per rank [2, 2, 2, 2] (all stop at the shortest)", _census(lambda c: c["steps"] == [2] * 4)
)


@ddpfaults.scenario(
    world_size=4,
    stall=SAFE_STALL,
    variants=[
        ddpfaults.variant(
            "no_sampler", kwargs={"sampler": False}, expect=expect("completed", SAME_SAMPLES, values_equal=True)
        ),
        ddpfaults.variant("sampler", expect=expect("completed", DISJOINT, values_equal=True)),
        ddpfaults.variant(
            "uneven_naive",
            faults=[SHORT],
            kwargs={"census": False},
            stall=HANG_STALL,
            expect="hung on rank 1 in all_reduce",
        ),
        ddpfaults.variant(
            "uneven_join",
            faults=[SHORT],
            kwargs={"uneven": "join"},
            expect=expect("completed", JOINED, values_equal=True),
        ),
        ddpfaults.variant(
            "uneven_drop_last",
            faults=[SHORT],
            kwargs={"uneven": "drop_last"},
            expect=expect("completed", DROPPED, values_equal=True),
        ),
    ],
)
def all_ranks_train(ctx, sampler=True, uneven=None, census=True):
    """Train an MLP on a shared 32-sample dataset (batch 2); return the census every rank agrees on
    (``census=False``: the bare loop, each rank returning only its own step count)."""
    x, y = make_regression(seed=ctx.seed, rank=0, step=0, batch_size=DATASET)
    dataset = TensorDataset(torch.arange(DATASET), x, y)
    shard = DistributedSampler(dataset, shuffle=False) if sampler else None
    loader = DataLoader(dataset, batch_size=BATCH, sampler=shard)
    short = ctx.fault(UnevenInputs)
    batches = list(short.limit(loader) if short else loader)
    if uneven == "drop_last":
        batches = remedies.even_batches(batches)
    model = MLP(seed=ctx.seed)
    ddp = ctx.ddp(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    seen, steps = [], 0
    with remedies.join(ddp) if uneven == "join" else contextlib.nullcontext():
        for step, (ids, xb, yb) in enumerate(batches):
            ctx.step(step)
            loss = F.mse_loss(ddp(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            seen += ids.tolist()
            steps += 1
    if not census:
        return steps
    return {"census": remedies.training_census(steps, seen), "digest": state_digest(model)}
