"""Gradient accumulation with ``ddp.no_sync()`` when the ranks disagree on the step that synchronises.

Every rank accumulates ``ACCUM`` micro-batches under ``no_sync()`` and lets the last one's backward
all_reduce the sum. The naive trainers decide *locally* when that is:

- ``local_counter_hang`` (4 micro-batches): the counter counts the batches a rank trained on, and rank 1
  skips its empty batch at step 1 (``EmptyBatch``): ranks 0, 2, 3 sync at steps 1 and 3, rank 1 at step 2
  only (it flushes its leftover step 3 locally). Its step-2 bucket all_reduce pairs with their step-1 one
  without error; rank 1 then finishes while the others wait in their step-3 all_reduce: a hang, named as
  rank 1 calling the gradient bucket's all_reduce at step 2 where its peers called it at step 1.
- ``local_counter_silent`` (5 micro-batches): the same trainer, one step longer. Now both sides sync twice
  (ranks 0, 2, 3 at steps 1 and 3, rank 1 at steps 2 and 4), so every collective pairs and the job
  **completes without an error**, but ranks 0, 2, 3 flush their step-4 gradient with a local
  ``optimizer.step()`` (accumulated under ``no_sync``, never all_reduced): all 4 replicas end different
  (checked over the returned digests).
- ``uneven_last_flush``: rank 1's loader is one batch short (``UnevenInputs(rank=1, batches=3)``) and a
  window also ends at a rank's last batch, so rank 1 syncs at steps 1 and 2, the others at 1 and 3. The
  ranks sync on different steps, yet the replicas stay **bit-equal**: each pair of all_reduces averages
  the same sum on every rank, and each rank steps once per all_reduce. What is wrong is only which
  samples were weighted together — no harness can see that from the weights.
- ``fixed``: the window ends on the step index (the same on every rank) and a rank with an empty batch
  still runs forward and backward (its zero-row loss adds a zero gradient): completes, bit-equal replicas.

Every variant: 5 runs, the same verdict each time. Against the field: "ranks disagreeing on the sync step
hang" holds only when their sync counts differ; with equal counts the all_reduces silently pair across
different steps (no error, no hang, gloo never checks the step), and the job either stays equal (wrong
sample weighting only) or diverges through an unsynced ``optimizer.step()``. Neither a crash nor a
"replicas out of sync" error ever appeared.
"""

import contextlib

import torch

import ddpfaults
from _checks import HANG_STALL, SAFE_STALL, expect, value_check
from ddpfaults.faults import EmptyBatch, UnevenInputs
from ddpfaults.toy.data import make_regression
from ddpfaults.toy.models import MLP, state_digest

ACCUM = 2
BATCH = 8
EMPTY = EmptyBatch(rank=1, step=1)
SHORT = UnevenInputs(rank=1, batches=3)

REPLICAS_DIFFER = value_check(
    "all 4 replicas differ (the job finished, silently wrong)",
    lambda values: None not in values and len(set(values)) == len(values),
)


def _sync_now(counter: str, step: int, micro: int, batches: int) -> bool:
    """Whether this micro-batch's backward all_reduces (ends an accumulation window)."""
    if counter == "local":  # counts the micro-batches this rank trained on
        return micro % ACCUM == 0
    return (step + 1) % ACCUM == 0 or step + 1 == batches  # the step index; a window also ends at the last batch


@ddpfaults.scenario(
    world_size=4,
    faults=[EMPTY],
    stall=SAFE_STALL,
    variants=[
        ddpfaults.variant(
            "local_counter_hang",
            kwargs={"counter": "local", "steps": 4},
            stall=HANG_STALL,
            expect="hung on rank 1 in all_reduce",
        ),
        ddpfaults.variant(
            "local_counter_silent",
            kwargs={"counter": "local", "steps": 5},
            expect=expect("completed", REPLICAS_DIFFER),
        ),
        ddpfaults.variant(
            "uneven_last_flush",
            faults=[SHORT],
            kwargs={"counter": "index", "steps": 4},
            expect=ddpfaults.Expect("completed", values_equal=True),
        ),
        ddpfaults.variant(
            "fixed",
            kwargs={"counter": "index", "steps": 5},
            expect=ddpfaults.Expect("completed", values_equal=True),
        ),
    ],
)
def grad_accumulation(ctx, counter, steps):
    """Train an MLP accumulating ``ACCUM`` micro-batches per optimizer step; return the weights' digest.

    ``counter="local"``: a rank skips an empty batch and counts only the micro-batches it trained on, then
    flushes a leftover window with a last ``optimizer.step()``; ``"index"``: every rank trains on every
    batch (an empty one adds a zero gradient) and syncs by the step index, a window also ending at the
    rank's last batch (the same step on every rank unless their loaders differ in length).
    """
    batches = [make_regression(seed=ctx.seed, rank=ctx.rank, step=s, batch_size=BATCH) for s in range(steps)]
    short = ctx.fault(UnevenInputs)
    if short is not None:
        batches = list(short.limit(batches))
    model = MLP(seed=ctx.seed)
    ddp = ctx.ddp(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    micro = 0
    for step, (x, y) in enumerate(batches):
        ctx.step(step)
        empty = ctx.fault(EmptyBatch)
        if empty is not None:
            x, y = empty.on_batch((x, y))
        if counter == "local" and len(x) == 0:
            continue  # nothing to learn from: skipped, and not counted
        micro += 1
        sync = _sync_now(counter, step, micro, len(batches))
        with contextlib.nullcontext() if sync else ddp.no_sync():
            loss = ((ddp(x) - y) ** 2).sum() / (BATCH * ACCUM)
            loss.backward()
        if sync:
            optimizer.step()
            optimizer.zero_grad()
    if micro % ACCUM and counter == "local":
        optimizer.step()  # flush the leftover window (its gradients were accumulated under no_sync)
    return state_digest(model)
