"""FSDP2 (``fully_shard`` per layer and on the root, a 1-D CPU mesh, gloo): two field failures of sharded training.

Measured on gloo, torch 2.13 (what the variants assert; /work/shared/measured-facts.md, "Sharded training"):

- ``fsdp_empty_batch[naive]``: rank 1's DataLoader yields an empty batch at step 1 (``EmptyBatch`` through the
  loader seam) and the trainer ``continue`` s past it, as report 000's freeze did under DDP and as the Accelerate
  measurement did at its closing barrier. FSDP2's all-gathers and reduce-scatters have the same sizes every step, so
  rank 1's next step pairs with its peers' current one without an error: the ranks agree on nothing yet no
  collective fails, until the gathered full state at the end meets a step's parameter all-gather; the judge names
  rank 1 (its DataLoader batch was emptied) at the first step where the ranks' collectives stopped matching.
- ``fsdp_empty_batch[agreed_skip]``: every rank all_reduces an "empty" flag and all skip together.
  ``fsdp_empty_batch[fixed]``: the empty rank runs forward and backward on its zero-row batch with a zero loss: its
  all-gathers and reduce-scatters match its peers', and the gathered full state is equal on every rank.
- ``fsdp_wrap_config[naive]``: one rank's wrapping config differs (read from a per-rank file a deploy left stale:
  ``fully_shard`` on the root only, where the others shard each layer), so its first all-gather has another size:
  gloo's size check aborts a *receiving* rank ("Received data size doesn't match" / "collective mismatch"), and
  the rank that diverged sees only "Connection reset by peer". The root cause is rank 1 (its config diverged),
  whichever rank gloo aborted. ``fsdp_wrap_config[fixed]``: rank 0 reads the config and broadcasts it.

Field: report 000 (docs/field-reports.md) and the Accelerate measurement (a rank that ``continue`` s past an empty
batch hangs the world only at its end) for the empty batch; pytorch#75373 (FSDP assumes "each rank wraps the same
module in the same way" and runs the same order, unchecked: "it would either result in hang or incorrect results")
and torchtitan#2747 / pytorch#158719 (FSDP2 collectives of different sizes across ranks) for the wrapping config.
"""

import json
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F

import ddpfaults
from _checks import HANG_STALL, SAFE_STALL
from ddpfaults.faults import EmptyBatch
from ddpfaults.toy.sharded import full_digest, regression_loader, sharded_mlp

DIVERGED = 1


@ddpfaults.scenario(
    world_size=4,
    faults=[EmptyBatch(rank=DIVERGED, step=1)],
    stall=SAFE_STALL,
    variants=[
        ddpfaults.variant(
            "naive",
            kwargs={"strategy": "skip"},
            stall=HANG_STALL,
            expect=ddpfaults.Expect("hung", rank=DIVERGED, root_cause=f"rank {DIVERGED} "),
        ),
        ddpfaults.variant(
            "agreed_skip", kwargs={"strategy": "agreed_skip"}, expect=ddpfaults.Expect("completed", values_equal=True)
        ),
        ddpfaults.variant(
            "fixed", kwargs={"strategy": "zero_loss"}, expect=ddpfaults.Expect("completed", values_equal=True)
        ),
    ],
)
def fsdp_empty_batch(ctx, strategy, steps=3):
    """Train the sharded MLP from a DataLoader; rank 1's batch at step 1 is empty; return the full state's digest."""
    model = sharded_mlp(ctx.world_size, seed=ctx.seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    batches = iter(regression_loader(seed=ctx.seed, rank=ctx.rank, batches=steps))
    for step in range(steps):
        ctx.step(step)
        x, y = next(batches)
        empty = len(x) == 0
        if strategy == "skip" and empty:
            continue
        if strategy == "agreed_skip":
            flag = torch.tensor([int(empty)])
            dist.all_reduce(flag)
            if flag.item():
                continue
        out = model(x)
        loss = out.sum() * 0 if empty else F.mse_loss(out, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    dist.barrier()  # the end of the epoch, as trainers mark it
    return full_digest(model)


def _local_config(ctx, stale_rank) -> dict:
    """The wrapping config this rank reads from its own copy of the config file (``stale_rank``'s is stale)."""
    path = os.path.join(ctx.shared_dir, f"fsdp-config-rank{ctx.rank}.json")
    with open(path, "w") as f:
        json.dump({"per_layer": ctx.rank != stale_rank}, f)
    with open(path) as f:
        return json.load(f)


@ddpfaults.scenario(
    world_size=4,
    stall=SAFE_STALL,
    variants=[
        ddpfaults.variant(
            "naive",
            kwargs={"config": "local"},
            expect=ddpfaults.Expect("crashed", rank=DIVERGED, root_cause=f"rank {DIVERGED} "),
        ),
        ddpfaults.variant(
            "fixed", kwargs={"config": "broadcast"}, expect=ddpfaults.Expect("completed", values_equal=True)
        ),
    ],
)
def fsdp_wrap_config(ctx, config, steps=2):
    """Wrap the MLP by a config each rank reads itself (``local``) or rank 0 reads and broadcasts; train; return the
    full state's digest."""
    plan = [_local_config(ctx, stale_rank=DIVERGED)]
    if config == "broadcast":
        dist.broadcast_object_list(plan, src=0)
    model = sharded_mlp(ctx.world_size, seed=ctx.seed, per_layer=plan[0]["per_layer"])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    batches = iter(regression_loader(seed=ctx.seed, rank=ctx.rank, batches=steps))
    for step in range(steps):
        ctx.step(step)
        x, y = next(batches)
        loss = F.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return full_digest(model)
