"""``torch.nn.SyncBatchNorm`` when one rank's batch is empty, or of another size, on CPU and gloo.

torch 2.13.0's ``SyncBatchNorm`` does not run on CPU at all, so on gloo the empty batch never gets a chance:

- ``sync_bn_ddp``: ``convert_sync_batchnorm`` then DDP: every rank raises ``ValueError: SyncBatchNorm layers
  only work with GPU modules`` in DDP's constructor (after its construction broadcasts: the failed ranks
  linger, so a fast rank's exit cannot turn a slower one's broadcast into "Connection closed"). Rank 1's
  ``EmptyBatch`` at step 1 never fires (the plan shows it unfired) and a batch size has no say.
- ``sync_bn_forward``: the same layers without DDP, to reach SyncBatchNorm's own forward: every rank raises
  ``ValueError: SyncBatchNorm expected input tensor to be on GPU or XPU or privateuseone`` at step 0, the
  empty rank included (the device check precedes everything). Below it, ``torch/nn/modules/_functions.py``
  does have a gloo path (``all_gather`` of per-rank mean, invstd and count, an empty rank sending zeros and a
  count of 0, and joining the backward ``all_reduce`` with zeros), but its kernels (``batch_norm_stats``,
  ``batch_norm_elemt``, ``batch_norm_gather_stats_with_counts``, ``batch_norm_backward_reduce``) raise
  NotImplementedError for CPU tensors: the empty-rank protocol cannot be exercised on CPU.
- ``plain_bn_empty``: the usual CPU fallback, plain ``BatchNorm1d``, rank 1's batch empty at step 1: completes
  (an empty batch is a no-op for BatchNorm in training: no error, running statistics untouched, zero
  gradients) with bit-equal parameters, but the running statistics differ on every rank — DDP broadcasts
  rank 0's buffers before each forward, then each rank updates them from its own batch (checked).
- ``fixed``: :func:`ddpfaults.remedies.convert_gloo_sync_batchnorm` (statistics summed over ranks with the
  autograd-aware ``torch.distributed.nn.functional.all_reduce``; an empty rank joins with zeros and a count
  of 0): completes, parameters and running statistics bit-equal on every rank.
- ``fixed_other_size``: the same with rank 1's batch 3 rows against the others' 8, no empty batch:
  completes bit-equal (the counts weight each rank's sums).

Each variant 5 runs, the same verdict each time. Against the field: the "SyncBatchNorm hangs (or fails an
all_gather size check) when one rank's batch is empty" claim cannot even arise on CPU/gloo — the refusal is
at construction; and torch's own code shows the empty-rank case is handled (zeros and a count of 0 in the
same collectives), so such a hang would need a rank that skips the forward, not an empty one.
"""

import torch
from torch import nn

import ddpfaults
from _checks import SAFE_STALL, every_rank_errors, expect, value_check
from ddpfaults import remedies
from ddpfaults.faults import EmptyBatch
from ddpfaults.toy.data import make_regression
from ddpfaults.toy.models import state_digest

BATCH = 8
EMPTY = EmptyBatch(rank=1, step=1)
PARAMS_EQUAL_BUFFERS_DIFFER = value_check(
    "parameters bit-equal on every rank, running statistics different on every rank",
    lambda values: (
        None not in values
        and len({v["params"] for v in values}) == 1
        and len({v["buffers"] for v in values}) == len(values)
    ),
)


class BNMLP(nn.Module):
    """A seeded ``Linear -> BatchNorm1d -> ReLU -> Linear`` regression model."""

    def __init__(self, *, in_dim: int = 8, hidden: int = 16, seed: int = 0):
        super().__init__()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.net = nn.Sequential(nn.Linear(in_dim, hidden), nn.BatchNorm1d(hidden), nn.ReLU(), nn.Linear(hidden, 2))

    def forward(self, x):
        """The model applied to a batch."""
        return self.net(x)


def _norm(model, norm):
    if norm == "sync":
        return nn.SyncBatchNorm.convert_sync_batchnorm(model)
    if norm == "gloo_sync":
        return remedies.convert_gloo_sync_batchnorm(model)
    return model


@ddpfaults.scenario(
    world_size=4,
    faults=[EMPTY],
    stall=SAFE_STALL,
    variants=[
        ddpfaults.variant(
            "sync_bn_ddp",
            kwargs={"norm": "sync"},
            peer_failure="linger",
            expect=expect(
                "crashed with ValueError",
                every_rank_errors("ValueError"),
                root_cause="SyncBatchNorm layers only work with GPU modules",
                faults_fire=False,
            ),
        ),
        ddpfaults.variant(
            "sync_bn_forward",
            faults=[EmptyBatch(rank=1, step=0)],
            kwargs={"norm": "sync", "wrap": False},
            peer_failure="linger",
            expect=expect(
                "crashed with ValueError",
                every_rank_errors("ValueError"),
                root_cause="SyncBatchNorm expected input tensor to be on GPU or XPU",
            ),
        ),
        ddpfaults.variant(
            "plain_bn_empty",
            kwargs={"norm": "plain"},
            expect=expect("completed", PARAMS_EQUAL_BUFFERS_DIFFER),
        ),
        ddpfaults.variant(
            "fixed",
            kwargs={"norm": "gloo_sync"},
            expect=ddpfaults.Expect("completed", values_equal=True),
        ),
        ddpfaults.variant(
            "fixed_other_size",
            faults=[],
            kwargs={"norm": "gloo_sync", "rank1_batch": 3},
            expect=ddpfaults.Expect("completed", values_equal=True),
        ),
    ],
)
def sync_batchnorm(ctx, norm, wrap=True, rank1_batch=BATCH, steps=3):
    """Train the BatchNorm MLP (loss: squared error summed over a fixed ``BATCH``, so an empty batch adds 0)
    with plain, torch's sync or the gloo sync BatchNorm; ``wrap=False``: no DDP; ``rank1_batch``: rank 1's
    batch size. Return the digests of the parameters and of the running statistics."""
    model = _norm(BNMLP(seed=ctx.seed), norm)
    ddp = ctx.ddp(model) if wrap else model
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(steps):
        ctx.step(step)
        size = rank1_batch if ctx.rank == 1 else BATCH
        x, y = make_regression(seed=ctx.seed, rank=ctx.rank, step=step, batch_size=size)
        empty = ctx.fault(EmptyBatch)
        if empty is not None:
            x, y = empty.on_batch((x, y))
        loss = ((ddp(x) - y) ** 2).sum() / BATCH
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    buffers = {k: v for k, v in model.state_dict().items() if k.endswith(("running_mean", "running_var"))}
    return {"params": state_digest(dict(model.named_parameters())), "buffers": state_digest(buffers)}
