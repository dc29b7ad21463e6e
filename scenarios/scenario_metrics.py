"""Lightning #19106: ranks log different metric keys, so the metric reductions (``sync_dist=True``) mismatch.

Every step trains an MLP under DDP, then validates the local replica on the rank's validation batch and logs
``val_samples`` always and ``val_mse`` only when the batch has samples (a mean over none is NaN).
``EmptyBatch(rank=1, ...)`` empties rank 1's validation batch, so rank 1 logs one key fewer at that step.
Measured on gloo (what the variants assert):

- ``naive`` (empty batch at step 1 of 3): each rank all_reduces its own keys, one call per key in key order.
  Rank 1's ``val_samples`` pairs silently with its peers' ``val_mse``, then its step-2 gradient bucket (178
  floats) meets their ``val_samples`` (1 element): gloo aborts a receiver (SIGABRT on rank 0, "Received data
  size doesn't match expected size"), the others get "Connection reset/closed by peer": a crash, named as
  rank 1 diverging (6 of 6 runs).
- ``naive_last_step`` (empty batch at the last step): nothing follows the missing reduction, so rank 1
  finishes while ranks 0 and 2 wait in their last ``all_reduce``: a hang on rank 1 (6 of 6).
- ``naive_stacked``: the same keys stacked into one tensor, one all_reduce: rank 1 sends 1 element, its peers
  2. Gloo does not detect it: all three ranks block in that all_reduce: a hang, named on rank 1 (6 of 6).
- ``naive_crossed``: the empty rank logs ``val_empty`` instead of ``val_mse`` (a counter logged only when it
  happens): the same number of keys, so every per-key all_reduce pairs up and the run completes — with rank 1's
  ``val_empty`` summed into ranks 0 and 2's ``val_mse``, which the variant's check proves from every rank's
  local metrics (6 of 6). The silent failure: no error, wrong numbers.
- ``fixed``: the ranks agree on the key set first and reduce one tensor
  (:func:`ddpfaults.remedies.sync_metrics`: one ``all_gather_object`` of the sorted keys, one ``all_reduce``
  of values and counts; a key is averaged over the ranks that logged it): completes with bit-equal replicas
  and the same, correct metrics on every rank.

Contradicted field claims: a key logged on some ranks only is said to hang ``sync_dist``; on gloo that holds
only when the missing reduction is the last collective or the sizes differ little (stacked); mid-training
it crashes (the next DDP bucket meets a metric reduction), and a key swapped for another never fails at all.
"""

import torch
import torch.distributed as dist

import ddpfaults
from _checks import HANG_STALL, SAFE_STALL, expect, value_check
from ddpfaults import remedies
from ddpfaults.faults import EmptyBatch
from ddpfaults.toy.data import make_regression
from ddpfaults.toy.models import MLP, regression_step, state_digest

EMPTY_MID = EmptyBatch(rank=1, step=1)
EMPTY_LAST = EmptyBatch(rank=1, step=2)
VALIDATION = 1000  # validation batches are drawn at step VALIDATION + step: never a training batch


def _validate(ctx, model, step, count_empty):
    """This rank's metrics on its validation batch at ``step``: ``val_mse`` only when the batch has samples,
    ``val_empty`` (``count_empty``) only when it has none."""
    batch = make_regression(seed=ctx.seed, rank=ctx.rank, step=VALIDATION + step)
    empty = ctx.fault(EmptyBatch)
    x, y = empty.on_batch(batch) if empty is not None else batch
    metrics = {"val_samples": float(len(x))}
    if len(x):
        with torch.no_grad():
            metrics["val_mse"] = float(((model(x) - y) ** 2).mean())
    elif count_empty:
        metrics["val_empty"] = 1.0
    return metrics


def _reduce_per_key(metrics):
    """The naive sync: one all_reduce (mean over ranks) per key this rank logged, in key order."""
    reduced = {}
    for key in sorted(metrics):
        value = torch.tensor([metrics[key]], dtype=torch.float64)
        dist.all_reduce(value)
        reduced[key] = float(value) / dist.get_world_size()
    return reduced


def _reduce_stacked(metrics):
    """The naive sync in one call: this rank's values, stacked in key order, all_reduced as one tensor."""
    values = torch.tensor([metrics[k] for k in sorted(metrics)], dtype=torch.float64)
    dist.all_reduce(values)
    return dict(zip(sorted(metrics), (values / dist.get_world_size()).tolist(), strict=True))


SYNC = {"per_key": _reduce_per_key, "stacked": _reduce_stacked, "agreed": remedies.sync_metrics}


def _close(a, b):
    return abs(a - b) <= 1e-9 * max(1.0, abs(b))


def _agreed(values):
    synced, local = [v["synced"][1] for v in values], [log[1] for log in values[0]["local"]]
    true_mse = (local[0]["val_mse"] + local[2]["val_mse"]) / 2
    return (
        all(log == synced[0] for log in synced)
        and sorted(synced[0]) == ["val_empty", "val_mse", "val_samples"]
        and synced[0]["val_empty"] == 1.0
        and synced[0]["val_samples"] == 16 / 3
        and _close(synced[0]["val_mse"], true_mse)
    )


def _crossed(values):
    synced, local = [v["synced"][1] for v in values], [log[1] for log in values[0]["local"]]
    crossed = (local[0]["val_mse"] + 1.0 + local[2]["val_mse"]) / 3  # rank 1's val_empty summed into val_mse
    return "val_mse" not in synced[1] and all(
        _close(log, crossed) for log in (synced[0]["val_mse"], synced[1]["val_empty"], synced[2]["val_mse"])
    )


AGREED = value_check(
    "step 1: the same keys and values on every rank; val_empty 1, val_samples 16/3, val_mse the mean of "
    "ranks 0 and 2's local val_mse",
    _agreed,
)
CROSSED = value_check(
    "step 1: rank 1's val_empty was reduced with ranks 0 and 2's val_mse: their val_mse is (mse0 + 1 + mse2) / 3",
    _crossed,
)


@ddpfaults.scenario(
    world_size=3,
    faults=[EMPTY_MID],
    stall=SAFE_STALL,
    variants=[
        ddpfaults.variant("naive", kwargs={"sync": "per_key"}, expect="crashed on rank 1 in all_reduce"),
        ddpfaults.variant(
            "naive_last_step",
            faults=[EMPTY_LAST],
            kwargs={"sync": "per_key", "census": False},
            stall=HANG_STALL,
            expect="hung on rank 1 in all_reduce",
        ),
        ddpfaults.variant(
            "naive_stacked", kwargs={"sync": "stacked"}, stall=HANG_STALL, expect="hung on rank 1 in all_reduce"
        ),
        ddpfaults.variant(
            "naive_crossed",
            kwargs={"sync": "per_key", "count_empty": True},
            expect=expect("completed", CROSSED),
        ),
        ddpfaults.variant(
            "fixed",
            kwargs={"sync": "agreed", "count_empty": True},
            expect=expect("completed", AGREED, values_equal=True),
        ),
    ],
)
def metrics(ctx, sync, count_empty=False, census=True, steps=3):
    """Train an MLP; after each step validate locally and sync the logged metrics by ``sync``; return the
    weights' digest, every step's synced metrics and (``census``) every rank's local metrics, gathered."""
    model = MLP(seed=ctx.seed)
    ddp = ctx.ddp(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    local, synced = [], []
    for step in range(steps):
        regression_step(ctx, ddp, optimizer, step)
        local.append(_validate(ctx, model, step, count_empty))
        synced.append(SYNC[sync](local[-1]))
    if census:
        gathered = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, local)
        local = gathered
    return {"digest": state_digest(model), "synced": synced, "local": local}
