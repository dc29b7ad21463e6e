"""Report 000, second failure: the empty rank's fake target was written by hand and misses a key.

The real targets carry ``segment_mask`` (``SchemaDrift(key="segment_mask")``); the hand-copied fake
target has only ``labels``, ``masks``, ``point2segment``, so the matcher raises
``KeyError: 'segment_mask'`` on the empty rank alone. Measured: with gloo's native peer failure
(``exit``) the peers get "Connection closed by peer" and the world crashes; when the failed rank
lingers with its sockets open (NCCL-like) the peers wait in the criterion's ``all_reduce``: a hang.
The report saw the process killed by its own crashing error handler; the root cause is the same
KeyError either way. Fixed: the fake target is derived from a real target, so it cannot miss a key.
"""

import torch

import ddpfaults
from _checks import HANG_STALL, SAFE_STALL
from ddpfaults import remedies
from ddpfaults.faults import EmptyBatch, SchemaDrift
from ddpfaults.toy.data import handmade_fake_target, make_batch, make_scene, stack_point2segment
from ddpfaults.toy.models import SetCriterion, SetPredictionModel, state_digest

FAULTS = [EmptyBatch(rank=0, step=1), SchemaDrift(key="segment_mask")]


@ddpfaults.scenario(
    world_size=4,
    faults=FAULTS,
    stall=SAFE_STALL,
    variants=[
        ddpfaults.variant(
            "naive_exit",
            peer_failure="exit",
            kwargs={"fake": "handmade"},
            expect=ddpfaults.Expect("crashed", rank=0, error="KeyError", root_cause="'segment_mask'"),
        ),
        ddpfaults.variant(
            "naive_linger",
            peer_failure="linger",
            stall=HANG_STALL,
            kwargs={"fake": "handmade"},
            expect=ddpfaults.Expect("hung", rank=0, error="KeyError", root_cause="'segment_mask'"),
        ),
        ddpfaults.variant("fixed", kwargs={"fake": "derived"}, expect=ddpfaults.Expect("completed", values_equal=True)),
    ],
)
def partial_fake_target(ctx, fake, steps=3):
    """Every rank agrees on emptiness and runs the criterion; rank 0's empty batch uses a ``fake`` target."""
    model = SetPredictionModel(seed=ctx.seed)
    ddp = ctx.ddp(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    criterion = SetCriterion()
    drift = ctx.fault(SchemaDrift)  # asked once, before the loop: the data schema of the whole run
    reference = make_scene(seed=ctx.seed, index=0)[1]
    for step in range(steps):
        ctx.step(step)
        points, targets = make_batch(seed=ctx.seed, rank=ctx.rank, step=step)
        if drift is not None:
            targets = [drift.apply(t) for t in targets]
        empty = ctx.fault(EmptyBatch)
        if remedies.all_ranks_empty(empty is not None):
            continue
        if empty is not None and fake == "handmade":
            p2s = targets[0]["point2segment"]
            targets = [handmade_fake_target(p2s.shape[0], model.num_segments) for _ in targets]
        elif empty is not None:
            targets = remedies.fake_targets(drift.apply(reference) if drift else reference, targets)
        outputs = ddp(points, stack_point2segment(targets))
        loss = criterion(outputs, targets)  # the matcher reads targets[b]["segment_mask"]
        if drift is not None:
            drift.require(targets)  # whatever else reads the drifted key
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return state_digest(model)
