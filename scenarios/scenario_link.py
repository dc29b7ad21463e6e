"""Issue 15: one rank's link to its peers is slow, or drops, at one collective: a straggler, or a crash?

``SlowLink`` holds rank 1's collective back ``delay`` seconds; ``DroppedLink`` shuts down every gloo TCP
connection of rank 1 as it enters the collective. Training: the MLP under DDP (``ctx.ddp``), plus a loss
all_reduce for logging each step. Measured on gloo (what the variants assert):

- ``slow_bucket``: rank 1's gradient bucket all_reduce at step 1 is 0.5 s late: its peers wait inside the
  all_reduce and the world completes with bit-equal replicas (a straggler, not a hang).
- ``slow_allreduce``: the same on the loss all_reduce.
- ``dropped_bucket`` / ``dropped_allreduce``: rank 1's links drop entering that collective: rank 1 raises
  ``LinkDropped`` there and its peers, in the collective, ``RuntimeError: ... Connection closed by peer`` (in 2
  of 59 runs one peer got another gloo read error, pair.cc:537, also a peer-failure error): a crash, not
  a hang, named as rank 1. (Measured before ``DroppedLink`` raised on its own rank: rank 1 too got
  gloo's "Connection closed by peer", every error looked collateral, and the judge named whichever rank raised
  first, rank 0, 1 or 2 across 6 runs: it does not consult the fault's fired record.)
"""

import torch
import torch.distributed as dist

import ddpfaults
from _checks import SAFE_STALL
from ddpfaults import Check
from ddpfaults.faults import DroppedLink, SlowLink
from ddpfaults.toy.models import MLP, regression_step, state_digest

DELAY = 0.5


def _peers_collateral(rank: int) -> Check:
    """Every rank but ``rank`` raised one of gloo's peer-failure errors (what the judge calls collateral)."""

    def fn(result):
        bad = [f"rank {r.rank}: {r.error or r.state}" for r in result.ranks if r.rank != rank and not r.collateral]
        return f"not collateral: {bad}" if bad else None

    return Check(f"every rank but {rank} failed on its peer's failure", fn)


@ddpfaults.scenario(
    world_size=3,
    stall=SAFE_STALL,
    variants=[
        ddpfaults.variant(
            "slow_bucket",
            faults=[SlowLink(rank=1, step=1, op="ddp_bucket", delay=DELAY)],
            expect=ddpfaults.Expect("completed", values_equal=True),
        ),
        ddpfaults.variant(
            "slow_allreduce",
            faults=[SlowLink(rank=1, step=1, op="all_reduce", delay=DELAY)],
            expect=ddpfaults.Expect("completed", values_equal=True),
        ),
        ddpfaults.variant(
            "dropped_bucket",
            faults=[DroppedLink(rank=1, step=1, op="ddp_bucket")],
            expect=ddpfaults.Expect("crashed", rank=1, error="LinkDropped", checks=(_peers_collateral(1),)),
        ),
        ddpfaults.variant(
            "dropped_allreduce",
            faults=[DroppedLink(rank=1, step=1, op="all_reduce")],
            expect=ddpfaults.Expect("crashed", rank=1, error="LinkDropped", checks=(_peers_collateral(1),)),
        ),
    ],
)
def link(ctx, steps=3):
    """Train the MLP under DDP, all_reducing the loss for logging each step; return the weights' digest."""
    model = MLP(seed=ctx.seed)
    ddp = ctx.ddp(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(steps):
        logged = regression_step(ctx, ddp, optimizer, step).clone()
        dist.all_reduce(logged)
    return state_digest(model)
