"""Lightning #12190: one rank's loss is NaN and that rank skips ``backward`` / ``optimizer.step``.

``EmptyBatch(rank=1, step=1)`` empties rank 1's regression batch at step 1: ``F.mse_loss`` over zero samples is
NaN (0/0), the classic "bad loss on one rank". Measured on gloo with plain DDP (what the variants assert):

- ``naive_skip``: the bad rank ``continue`` s past ``backward`` and ``step`` (``if not torch.isfinite(loss)``).
  Its next step's gradient-bucket all_reduce pairs with its peers' current one (same size: gloo sees nothing
  wrong), so it finishes a step early while ranks 0 and 2 wait in the last bucket all_reduce: a hang, named as
  rank 1 diverging at the DDP gradient bucket (6 of 6 runs). The field's "hang" holds while the early rank
  stays alive (as here, and as on NCCL); under torchrun that rank exits and gloo peers get "Connection closed
  by peer" instead (measured-facts.md, the empty-batch ``continue`` under torchrun).
- ``fixed_skip_together``: every rank all_reduces a "my loss is bad" flag
  (:func:`ddpfaults.remedies.any_rank`) and all skip the step together: completes, bit-equal replicas.
- ``fixed_zero_loss``: the bad rank still runs ``backward`` on a zero that keeps the graph
  (``outputs.sum() * 0``: every parameter gets a zero gradient), so it joins every gradient all_reduce:
  completes, bit-equal replicas (the average then counts the bad rank's zeros).

The same holds for a loss that is exactly zero: what matters is that one rank alone skips ``backward``.
"""

import math

import torch
import torch.nn.functional as F

import ddpfaults
from _checks import HANG_STALL, SAFE_STALL
from ddpfaults import remedies
from ddpfaults.faults import EmptyBatch
from ddpfaults.toy.data import make_regression
from ddpfaults.toy.models import MLP, state_digest

BAD = EmptyBatch(rank=1, step=1)


@ddpfaults.scenario(
    world_size=3,
    faults=[BAD],
    stall=SAFE_STALL,
    variants=[
        ddpfaults.variant(
            "naive_skip", kwargs={"remedy": None}, stall=HANG_STALL, expect="hung on rank 1 in all_reduce"
        ),
        ddpfaults.variant(
            "fixed_skip_together",
            kwargs={"remedy": "skip_together"},
            expect=ddpfaults.Expect("completed", values_equal=True),
        ),
        ddpfaults.variant(
            "fixed_zero_loss", kwargs={"remedy": "zero_loss"}, expect=ddpfaults.Expect("completed", values_equal=True)
        ),
    ],
)
def bad_loss(ctx, remedy, steps=3):
    """Train an MLP; rank 1's batch at step 1 is empty, so its loss is NaN; return the weights' digest."""
    model = MLP(seed=ctx.seed)
    ddp = ctx.ddp(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(steps):
        ctx.step(step)
        batch = make_regression(seed=ctx.seed, rank=ctx.rank, step=step)
        empty = ctx.fault(EmptyBatch)
        x, y = empty.on_batch(batch) if empty is not None else batch
        outputs = ddp(x)
        loss = F.mse_loss(outputs, y)  # NaN over an empty batch
        bad = not math.isfinite(float(loss))
        if remedy == "skip_together":
            if remedies.any_rank(bad):
                continue  # every rank skips: no gradient all_reduce is left unmatched
        elif bad and remedy == "zero_loss":
            loss = outputs.sum() * 0  # finite, and reaches every parameter: the rank joins the all_reduce
        elif bad:
            continue  # the field's code: skip backward and step on this rank only
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return state_digest(model)
