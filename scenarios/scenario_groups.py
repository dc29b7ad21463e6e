"""Issue 40: beyond one process group. Subgroups (``new_group``), a 2-D DeviceMesh (dp x tp), a send/recv pipeline
and MoE-style ``all_to_all_single``, at 2 and 4 ranks, each naive and fixed. Measured on gloo (what the variants
assert; docs/groups.md tells the story):

- ``group_order``: every rank makes a dp x tp layout with ``new_group``; in ``naive`` rank 2 (4 ranks) makes its tp
  groups before its dp groups. torch names groups by a per-process counter and gloo connects a group's members
  through the store under that name: every rank waits in ``new_group`` for ever (gloo's 30-minute default for a
  subgroup), hung, named as rank 2 ("rank 2 created tp before dp"). At 2 ranks the split is one against one and
  names no one, saying why (a group is made once: no earlier step of a rank's own shows which order was meant).
  ``fixed``: one order on every rank.
- ``subgroup_barrier``: each tp pair all_reduces per step; in ``naive`` rank 1 alone calls ``barrier(group=tp)``
  at step 1 (its partner never reaches it): the partner's next all_reduce meets the barrier, hung. The divergence
  is found in the tp pair of ranks 0 and 1 alone (the other pair is not compared with it), one against one and a
  barrier made once; rank 1 is named because its stack stands inside a branch on its own rank (``ctx.rank ==
  lone_rank``) and rank 0's in none. ``fixed``: both members call it.
- ``pipeline_microbatches``: stage r receives microbatches from r-1 and sends them on; in ``naive`` one stage
  forwards one microbatch fewer at step 1 (it drops an incomplete last microbatch, its peers do not). gloo's send
  waits for its recv: the next stage waits in a recv never sent, hung, named as the stage that sent fewer.
- ``pipeline_size``: in ``naive`` one stage sends activations twice the size its next stage's buffer holds:
  gloo aborts the *receiver* (SIGABRT, "64 vs 32"), a crash named as the sender.
- ``moe_splits``: each rank routes a random number of tokens to every rank and calls ``all_to_all_single``; in
  ``naive`` it assumes each peer sends it what it sends them: gloo aborts a receiver sent more rows than it
  expected, named as the sender (rank 0, seeded). ``fixed``: the counts are exchanged first (an
  ``all_to_all_single`` of the counts).
- ``mesh_empty_tp``: a dp x tp mesh (``init_device_mesh``); ``EmptyBatch`` empties the last rank's batch at
  step 1; in ``naive`` that rank ``continue`` s past its tp all_reduce: its tp partner waits, hung, named as the
  last rank in its tp group. ``fixed``: the empty rank contributes zeros to both all_reduces.
"""

import torch
import torch.distributed as dist

import ddpfaults
from _checks import HANG_STALL, SAFE_STALL
from ddpfaults.faults import EmptyBatch


def _at(world_size: int, **fields) -> dict:
    return {"world_size": world_size, **fields}


def _variants(naive: dict, fixed: dict, sizes=(2, 4)) -> list:
    """``naive_N`` and ``fixed_N`` for each world size: ``naive``/``fixed`` map a size to its variant keywords."""
    found = []
    for size in sizes:
        found.append(ddpfaults.variant(f"naive_{size}", world_size=size, **naive[size]))
        found.append(ddpfaults.variant(f"fixed_{size}", world_size=size, **fixed[size]))
    return found


COMPLETED = ddpfaults.Expect("completed", values_equal=True)


@ddpfaults.scenario(
    world_size=4,
    stall=SAFE_STALL,
    variants=_variants(
        {
            2: {
                "kwargs": {"swap_rank": 1},
                "stall": HANG_STALL,
                "expect": ddpfaults.Expect("hung", root_cause="so nothing shows which order was meant"),
            },
            4: {
                "kwargs": {"swap_rank": 2},
                "stall": HANG_STALL,
                "expect": ddpfaults.Expect("hung", rank=2, root_cause="rank 2 created tp before dp"),
            },
        },
        {2: {"expect": COMPLETED}, 4: {"expect": COMPLETED}},
    ),
)
def group_order(ctx, swap_rank=None, steps=3):
    """Make a dp x tp layout with ``new_group`` (dp: ranks r and r + world/2; tp: the halves), every rank making
    every group, dp first (``swap_rank``: tp first); each step all_reduce in the tp group, then in the dp group."""
    size = dist.get_world_size()
    half = size // 2
    layouts = {"dp": [[r, r + half] for r in range(half)], "tp": [list(range(half)), list(range(half, size))]}
    mine = {}
    for dim in ("tp", "dp") if ctx.rank == swap_rank else ("dp", "tp"):
        for ranks in layouts[dim]:
            group = dist.new_group(ranks, group_desc=dim)
            if ctx.rank in ranks:
                mine[dim] = group
    total = torch.zeros(2)
    for step in range(steps):
        ctx.step(step)
        t = torch.ones(2) * (step + 1)
        dist.all_reduce(t, group=mine["tp"])
        dist.all_reduce(t, group=mine["dp"])
        total += t
    return total.tolist()


def _pairs(size: int) -> list:
    return [[r, r + 1] for r in range(0, size, 2)]


@ddpfaults.scenario(
    world_size=4,
    stall=SAFE_STALL,
    variants=_variants(
        {
            n: {
                "kwargs": {"lone_rank": 1},
                "stall": HANG_STALL,
                "expect": ddpfaults.Expect(
                    "hung", rank=1, collective="barrier", root_cause="rank 1 stood inside a branch on its rank"
                ),
            }
            for n in (2, 4)
        },
        {n: {"kwargs": {"lone_rank": None}, "expect": COMPLETED} for n in (2, 4)},
    ),
)
def subgroup_barrier(ctx, lone_rank=None, barrier_step=1, steps=5):
    """Each tp pair (ranks 2k, 2k+1) all_reduces per step; at ``barrier_step`` ``lone_rank`` calls
    ``barrier(group=tp)`` alone (None: both members of every pair call it)."""
    tp = None
    for ranks in _pairs(dist.get_world_size()):
        group = dist.new_group(ranks, group_desc="tp")
        tp = group if ctx.rank in ranks else tp
    total = torch.zeros(3)
    for step in range(steps):
        ctx.step(step)
        t = torch.ones(3) * (step + 1)
        dist.all_reduce(t, group=tp)
        total += t
        if step == barrier_step and (lone_rank is None or ctx.rank == lone_rank):
            dist.barrier(group=tp)
    return total.tolist()


@ddpfaults.scenario(
    world_size=4,
    stall=SAFE_STALL,
    variants=_variants(
        {
            2: {
                "kwargs": {"short_stage": 0},
                "stall": HANG_STALL,
                "expect": ddpfaults.Expect("hung", rank=0, root_cause="rank 0 sent 3 message(s) to rank 1 in step 1"),
            },
            4: {
                "kwargs": {"short_stage": 1},
                "stall": HANG_STALL,
                "expect": ddpfaults.Expect("hung", rank=1, root_cause="rank 1 sent 3 message(s) to rank 2 in step 1"),
            },
        },
        {n: {"expect": COMPLETED} for n in (2, 4)},
    ),
)
def pipeline_microbatches(ctx, short_stage=None, microbatches=4, steps=3, width=8):
    """Stage r receives ``microbatches`` activations a step from stage r-1, adds to them and sends them to stage r+1
    (blocking send/recv); ``short_stage`` forwards one fewer at step 1 (it drops an incomplete last microbatch).
    Returns the microbatches the stage handled (the same on every stage when they agree)."""
    rank, size = ctx.rank, dist.get_world_size()
    handled = 0
    for step in range(steps):
        ctx.step(step)
        forwarded = microbatches - 1 if rank == short_stage and step == 1 else microbatches
        for m in range(microbatches):
            x = torch.full((width,), float(m + step))
            if rank > 0:
                dist.recv(x, src=rank - 1)
            x = x + 1
            if rank < size - 1 and m < forwarded:
                dist.send(x, dst=rank + 1)
            handled += 1
    return handled


@ddpfaults.scenario(
    world_size=4,
    stall=SAFE_STALL,
    variants=_variants(
        {
            2: {
                "kwargs": {"wide_stage": 0},
                "expect": ddpfaults.Expect("crashed", rank=0, root_cause="rank 0 made send([16]) to rank 1"),
            },
            4: {
                "kwargs": {"wide_stage": 2},
                "expect": ddpfaults.Expect("crashed", rank=2, root_cause="rank 2 made send([16]) to rank 3"),
            },
        },
        {n: {"expect": COMPLETED} for n in (2, 4)},
    ),
)
def pipeline_size(ctx, wide_stage=None, microbatches=2, steps=2, width=8):
    """Stage r receives activations of ``width`` from stage r-1 and sends them on; ``wide_stage`` sends activations
    of twice the width (its layer's output, not the next stage's input). Returns the elements the stage received
    and sent (the same on every stage when the widths agree)."""
    rank, size = ctx.rank, dist.get_world_size()
    moved = 0
    for step in range(steps):
        ctx.step(step)
        for m in range(microbatches):
            x = torch.full((width,), float(m + step))
            if rank > 0:
                dist.recv(x, src=rank - 1)
            y = torch.cat([x, x]) if rank == wide_stage else x + 1
            if rank < size - 1:
                dist.send(y, dst=rank + 1)
            moved += y.numel()
    return moved


@ddpfaults.scenario(
    world_size=4,
    stall=SAFE_STALL,
    variants=_variants(
        {
            n: {
                "kwargs": {"exchange": False},
                "expect": ddpfaults.Expect("crashed", rank=0, root_cause="split sizes computed per rank"),
            }
            for n in (2, 4)
        },
        {n: {"kwargs": {"exchange": True}, "expect": COMPLETED} for n in (2, 4)},
    ),
)
def moe_splits(ctx, exchange, steps=3, hidden=4):
    """Each step route a seeded random number of tokens to every rank's expert with ``all_to_all_single``;
    ``exchange``: all_to_all the counts first, so each rank knows how many rows each peer sends it. Returns the rows
    every rank received, all_reduced (the same on every rank)."""
    size = dist.get_world_size()
    generator = torch.Generator().manual_seed(100 * ctx.rank + ctx.seed + 1)
    received = 0
    for step in range(steps):
        ctx.step(step)
        counts = torch.randint(0, 5, (size,), generator=generator)
        tokens = torch.ones(int(counts.sum()), hidden) * ctx.rank
        if exchange:
            incoming = torch.empty_like(counts)
            dist.all_to_all_single(incoming, counts)
        else:
            incoming = counts  # what it sends each peer, taken for what each peer sends it
        rows = torch.empty(int(incoming.sum()), hidden)
        dist.all_to_all_single(rows, tokens, output_split_sizes=incoming.tolist(), input_split_sizes=counts.tolist())
        received += rows.shape[0]
    total = torch.tensor([received])
    dist.all_reduce(total)
    return int(total)


@ddpfaults.scenario(
    world_size=4,
    stall=SAFE_STALL,
    variants=_variants(
        {
            2: {
                "kwargs": {"skip_empty": True},
                "faults": [EmptyBatch(rank=1, step=1)],
                "stall": HANG_STALL,
                "expect": ddpfaults.Expect("hung", rank=1),
            },
            4: {
                "kwargs": {"skip_empty": True},
                "faults": [EmptyBatch(rank=3, step=1)],
                "stall": HANG_STALL,
                "expect": ddpfaults.Expect("hung", rank=3),
            },
        },
        {
            2: {"kwargs": {"skip_empty": False}, "faults": [EmptyBatch(rank=1, step=1)], "expect": COMPLETED},
            4: {"kwargs": {"skip_empty": False}, "faults": [EmptyBatch(rank=3, step=1)], "expect": COMPLETED},
        },
    ),
)
def mesh_empty_tp(ctx, skip_empty, steps=5, width=4):
    """A dp x tp DeviceMesh (dp = world/2... at 2 ranks a 1 x 2 mesh); each step a tp all_reduce of the rank's
    partial activations, then a dp all_reduce of its gradient; an empty batch (``EmptyBatch``) is skipped
    (``skip_empty``) or contributes zeros."""
    from torch.distributed.device_mesh import init_device_mesh

    size = dist.get_world_size()
    mesh = init_device_mesh("cpu", (max(size // 2, 1), min(size, 2)), mesh_dim_names=("dp", "tp"))
    tp, dp = mesh.get_group("tp"), mesh.get_group("dp")
    total = 0.0
    for step in range(steps):
        ctx.step(step)
        batch = torch.ones(3, width) * (ctx.rank + step)
        if ctx.fault(EmptyBatch):
            batch = batch[:0]
        if len(batch) == 0 and skip_empty:
            continue
        partial = batch.sum(0)
        dist.all_reduce(partial, group=tp)
        grad = partial / 10
        dist.all_reduce(grad, group=dp)
        total += float(grad.sum())
    return total
