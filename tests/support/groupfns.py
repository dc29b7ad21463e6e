"""Rank functions with process groups beyond the default one, pickled into ranks by the tests (a 2-D mesh, subgroups
made in a chosen order)."""

import time

import torch
import torch.distributed as dist


def mesh_2d(ctx, skip_rank=None, skip_step=None, steps=5):
    """A dp x tp mesh of ``init_device_mesh`` (2 x world/2): each step all_reduces in the rank's tp group, then in
    its dp group; ``skip_rank`` skips its tp all_reduce at ``skip_step`` (an empty tp batch)."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (2, dist.get_world_size() // 2), mesh_dim_names=("dp", "tp"))
    tp, dp = mesh.get_group("tp"), mesh.get_group("dp")
    t = torch.ones(4)
    for step in range(steps):
        ctx.step(step)
        t = torch.ones(4) * (ctx.rank + step)
        if not (ctx.rank == skip_rank and step == skip_step):
            dist.all_reduce(t, group=tp)
        dist.all_reduce(t, group=dp)
    return float(t.sum())


def subgroups(ctx, steps=3):
    """Two halves of the world made by ``new_group`` (every rank makes both), and a group of the whole world made
    twice: each step all_reduces in the rank's half, in both whole-world groups and in the default group."""
    size = dist.get_world_size()
    halves = [list(range(size // 2)), list(range(size // 2, size))]
    made = [dist.new_group(ranks) for ranks in halves]
    mine = made[0] if ctx.rank in halves[0] else made[1]
    whole = [dist.new_group(list(range(size))), dist.new_group(list(range(size)))]
    total = 0.0
    for step in range(steps):
        ctx.step(step)
        for group in (mine, *whole, None):
            t = torch.ones(2 + ctx.rank // (size // 2)) if group is mine else torch.ones(3)
            dist.all_reduce(t, group=group)
            total += float(t.sum())
    return total


def groups_in_order(ctx, swap_rank=None, steps=2):
    """A dp x tp layout made by ``new_group`` (dp: ranks r and r + world/2; tp: the halves), every rank making every
    group, dp first; ``swap_rank`` makes tp first. Each step all_reduces in the rank's tp group, then its dp group."""
    size = dist.get_world_size()
    half = size // 2
    layouts = {
        "dp": [[r, r + half] for r in range(half)],
        "tp": [list(range(half)), list(range(half, size))],
    }
    order = ("tp", "dp") if ctx.rank == swap_rank else ("dp", "tp")
    mine = {}
    for dim in order:
        for ranks in layouts[dim]:
            group = dist.new_group(ranks, group_desc=dim)
            if ctx.rank in ranks:
                mine[dim] = group
    t = torch.ones(4)
    for step in range(steps):
        ctx.step(step)
        dist.all_reduce(t, group=mine["tp"])
        dist.all_reduce(t, group=mine["dp"])
    return float(t.sum())


def pipeline(ctx, short_stage=None, microbatches=3, steps=2, both_send_first=False):
    """Stage r receives ``microbatches`` activations a step from stage r-1 and sends them to stage r+1 (blocking
    send/recv); ``short_stage`` forwards one fewer at step 1. ``both_send_first``: two ranks each send to the other
    before receiving."""
    rank, size = ctx.rank, dist.get_world_size()
    if both_send_first:
        x = torch.ones(8)
        dist.send(x, dst=1 - rank)
        dist.recv(x, src=1 - rank)
        return float(x.sum())
    for step in range(steps):
        ctx.step(step)
        forwarded = microbatches - 1 if rank == short_stage and step == 1 else microbatches
        for m in range(microbatches):
            x = torch.full((8,), float(m))
            if rank > 0:
                dist.recv(x, src=rank - 1)
            if rank < size - 1 and m < forwarded:
                dist.send(x + 1, dst=rank + 1)
    return rank


def crossed_waits(ctx, crossed=True, mixed=False, steps=2, late_rank=None):
    """The dp x tp layout of :func:`groups_in_order` at 4 ranks, made in the same order by every rank: each step
    all_reduces in the rank's tp group and then makes a barrier in its dp group; with ``crossed``, ranks 1 and 2 make
    the dp barrier first at step 1: rank 0 waits in tp for rank 1, which waits in dp for rank 3, which waits in tp
    for rank 2, which waits in dp for rank 0. ``mixed`` (2 ranks): rank 0 receives from rank 1 before a barrier of
    the world, and rank 1 sends only after it. ``late_rank`` sleeps 1.5 s before its step-1 collectives (its peers
    wait for it in their groups, and it comes)."""
    rank, size = ctx.rank, dist.get_world_size()
    if mixed:
        x = torch.ones(8)
        if rank == 0:
            dist.recv(x, src=1)
            dist.barrier()
        else:
            dist.barrier()
            dist.send(x, dst=0)
        return float(x.sum())
    half = size // 2
    mine = {}
    for dim, layout in (
        ("dp", [[r, r + half] for r in range(half)]),
        ("tp", [list(range(half)), list(range(half, size))]),
    ):
        for ranks in layout:
            group = dist.new_group(ranks, group_desc=dim)
            if rank in ranks:
                mine[dim] = group
    t = torch.ones(4)
    for step in range(steps):
        ctx.step(step)
        if step == 1 and rank == late_rank:
            # fixed: late by 1.5 s against its test's 10 s stall: a wide margin, and a sleeping rank is not waiting
            time.sleep(1.5)
        if crossed and step == 1 and rank in (1, 2):
            dist.barrier(group=mine["dp"])
            dist.all_reduce(t, group=mine["tp"])
        else:
            dist.all_reduce(t, group=mine["tp"])
            dist.barrier(group=mine["dp"])
    return float(t.sum())


def group_pipeline(ctx, short=False, microbatches=3):
    """A two-stage pipeline inside the subgroup of ranks 2 and 3 (every rank makes it), addressed by group rank
    (``group_dst``/``group_src``, torch >= 2.6): stage 0 (rank 2) sends ``microbatches`` to stage 1 (rank 3), one
    fewer with ``short``; ranks 0 and 1 only make the group."""
    rank = ctx.rank
    stages = dist.new_group([2, 3])
    x = torch.ones(8)
    for m in range(microbatches - 1 if short and rank == 2 else microbatches):
        if rank == 2:
            dist.send(x * m, group_dst=1, group=stages)
        elif rank == 3:
            dist.recv(x, group_src=0, group=stages)
    return float(x.sum())


def torch_pipeline(ctx, short_step=None, steps=3):
    """``torch.distributed.pipelining`` at 2 ranks: a two-stage ``PipelineStage`` run by ``ScheduleGPipe``, 3 rows a
    microbatch; step 0 runs a schedule of 3 microbatches and one of 4 on both stages (each schedule's first step
    exchanges shapes), later steps the one of 4; at ``short_step`` stage 0 feeds the schedule of 3 (a microbatch
    fewer) while stage 1 still expects 4."""
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    torch.manual_seed(0)
    layer = torch.nn.Linear(8, 8)
    stage = PipelineStage(layer, ctx.rank, 2, torch.device("cpu"))

    def loss(out, target):
        return ((out - target) ** 2).mean()

    schedules = {n: ScheduleGPipe(stage, n_microbatches=n, loss_fn=loss) for n in (3, 4)}
    for step in range(steps):
        ctx.step(step)
        short = ctx.rank == 0 and step == short_step
        for n in (3, 4) if step == 0 else (3,) if short else (4,):
            if ctx.rank == 0:
                schedules[n].step(torch.randn(3 * n, 8))
            else:
                schedules[n].step(target=torch.randn(3 * n, 8), losses=[])
    return float(layer.weight.sum())


def groups_made(ctx, how, steps=3, skip_rank=None, skip_step=None):
    """The function form of ``scripts/mesh_groups.py`` (its ``--groups`` ways of making the rank's tp group; the
    default group is the world's already, so ``mesh`` makes a 1-D mesh over it): each step all_reduces on the
    world and on the tp group (``torch.distributed.nn.functional``'s for ``nn``, a functional collective for
    ``funcol``); ``skip_rank`` skips its tp
    all_reduce at ``skip_step``. Returns the world's sum."""
    import torch.distributed._functional_collectives as funcol
    import torch.distributed.nn.functional as dnn
    from torch.distributed.device_mesh import init_device_mesh

    from scripts.mesh_groups import tp_group

    if how == "mesh":
        init_device_mesh("cpu", (ctx.world_size,))
    tp = None if how == "mesh" else tp_group(how, ctx.world_size, ctx.rank)
    total = torch.ones(1)
    for step in range(steps):
        ctx.step(step)
        dist.all_reduce(total)
        if tp is not None and not (ctx.rank == skip_rank and step == skip_step):
            if how == "nn":
                dnn.all_reduce(torch.ones(2), group=tp)
            elif how == "funcol":
                funcol.all_reduce(torch.ones(2), "sum", tp).sum()  # the sum waits for it
            else:
                dist.all_reduce(torch.ones(2), group=tp)
    dist.barrier()
    return float(total.item())


def two_groups(ctx, swap_rank=None, extra_rank=None, steps=2):
    """The function form of ``scripts/two_groups.py``: groups ``a`` and ``b`` of the whole world, ``swap_rank``
    making ``b`` first, ``extra_rank`` first making a group of its own; each step all_reduces in ``a``, then ``b``."""
    from scripts.two_groups import make_groups, train_step

    groups = make_groups(ctx.rank, ctx.world_size, swap_rank, extra_rank)
    for step in range(steps):
        ctx.step(step)
        train_step(groups)
    return ctx.rank


def pipeline_chunks(ctx, short_step=None, steps=4):
    """The function form of ``scripts/pipeline_chunks.py``: a GPipe-ordered pipeline over blocking send/recv whose
    stage 0 cuts each step's batch with ``chunk``; at ``short_step`` its batch holds one microbatch fewer."""
    from scripts.pipeline_chunks import batch_of, pipeline_step

    total = 0.0
    for step in range(steps):
        ctx.step(step)
        total += pipeline_step(ctx.rank, ctx.world_size, batch_of(step, short_step) if ctx.rank == 0 else None)
    return total
