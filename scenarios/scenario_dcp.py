"""Distributed Checkpoint (``dcp.save``/``dcp.load``/``dcp.async_save``) with FSDP2 on gloo: four field failures.

Measured on gloo, torch 2.13 (what the variants assert; /work/shared/measured-facts.md, "Sharded training"):

- ``dcp_rank0_save[naive]``: ``if rank == 0: dcp.save(...)`` (it is a collective: every rank plans and writes its
  own shard). Rank 0 waits in DCP's plan exchange while the others wait in the barrier after it; gloo does not
  notice an all_gather meeting a barrier: a hang, on rank 0. ``[fixed]``: every rank calls ``dcp.save``.
  Field: DeepSpeed#797/#801 (``save_checkpoint`` called on rank 0 only hangs; every rank must call it), the same
  shape as DCP's ``save``.
- ``dcp_exists_check[naive]``: each rank decides on its own whether a checkpoint exists before ``dcp.load``; on
  rank 1 the checkpoint is not yet visible (``CheckpointNotVisible``: an eventually-consistent shared filesystem),
  so it starts training while its peers load: gloo's size check aborts a *receiving* rank. The root cause is rank 1
  (whose view diverged). ``[fixed]``: every rank looks, rank 0 decides and broadcasts. Field:
  KempnerInstitute/KempnerForge#49 (per-rank ``exists()`` on NFS/Lustre disagreed and the load deadlocked; fixed by
  rank 0's decision, broadcast), InternLM/xtuner#1852 (the same fix for ``async_save_dcp``).
- ``dcp_torn[naive]``: the checkpoint is overwritten in place and one write is torn (``TornDcpWrite``: rank 1's
  shard, or ``.metadata``); ``dcp.load`` raises ``CheckpointException`` on every rank, naming the rank(s) that
  failed. It derives from ``BaseException``, so the trainer's ``except Exception`` fallback does not catch it. The
  root cause is the rank the exception names, not the first to raise. ``[fixed]``: each save goes to a temporary
  directory renamed into place, and the loader falls back to the last good checkpoint on ``CheckpointException``
  (caught by name). Field: pytorch#122529 (DCP gathers a read failure to every rank before raising it),
  bghira/SimpleTuner#1880 (``CheckpointException ranks:dict_keys([0, ..., 7])`` on every rank);
  ``class CheckpointException(BaseException)`` in torch/distributed/checkpoint/api.py.
- ``dcp_async_save``: ``dcp.async_save`` after every step, on a checkpoint group of its own, and the writer rank 1
  is SIGKILLed as its save at step 1 returns (``AsyncSaveKilled``: a preempted node), before the future completes.
  ``[naive]`` advances the ``latest`` pointer as soon as ``async_save`` returns: a restart finds it on a checkpoint
  that will never be completed (no ``.metadata``). ``[fixed]`` awaits the future before the next save and at exit,
  and advances the pointer only then: a restart finds the last completed checkpoint. (Rank 0 writes the pointer
  and says what a restart finds; a survivor that fails sooner reads the pointer before rank 0 has advanced it.)
  Measured too, not a case since its outcome is a race: ``async_save`` on the default group, not awaited, while
  training goes on: the save's plan exchange, from DCP's thread, meets the training's FSDP all-gathers on the same
  group and gloo aborts a rank or the world hangs. The form pytorch#144657 reported, an update before the future
  completed being saved, no longer reproduces on torch 2.13: the staging copy is taken before ``async_save``
  returns. Field: torchtitan#930 (an async save's ``load`` before persistence finished failed), pytorch#144657.
"""

import os
import shutil

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
from torch.distributed.checkpoint.api import CheckpointException

import ddpfaults
from _checks import HANG_STALL, SAFE_STALL, expect, value_check
from ddpfaults import Check
from ddpfaults.faults import AsyncSaveKilled, CheckpointNotVisible, TornDcpWrite
from ddpfaults.toy.sharded import full_digest, regression_loader, sharded_mlp

DIVERGED = 1
ROUND_TRIP = value_check(
    "every rank's gathered full state survived the DCP round trip", lambda values: all(v[0] == v[1] for v in values)
)


def _train(ctx, model, steps, first=0):
    """``steps`` SGD steps of the sharded MLP from this rank's DataLoader, announcing steps ``first``...; yields each
    step after its optimizer step."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    batches = iter(regression_loader(seed=ctx.seed, rank=ctx.rank, batches=steps))
    for step in range(first, first + steps):
        ctx.step(step)
        x, y = next(batches)
        loss = F.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        yield step


def _load_into_fresh(ctx, path):
    """A fresh sharded MLP (other weights) with the checkpoint at ``path`` loaded into it."""
    restored = sharded_mlp(ctx.world_size, seed=ctx.seed + 1)
    state = {"model": restored.state_dict()}
    dcp.load(state, checkpoint_id=path)
    restored.load_state_dict(state["model"])
    return restored


@ddpfaults.scenario(
    world_size=4,
    stall=SAFE_STALL,
    variants=[
        ddpfaults.variant("naive", kwargs={"who": "rank0"}, stall=HANG_STALL, expect="hung on rank 0"),
        ddpfaults.variant(
            "fixed",
            kwargs={"who": "every"},
            expect=ddpfaults.Expect("completed", values_equal=True, checks=(ROUND_TRIP,)),
        ),
    ],
)
def dcp_rank0_save(ctx, who, steps=2):
    """Train, save with DCP (on rank 0 only, or on every rank), barrier, load into a fresh model; return the full
    state's digest before the save and after the load."""
    model = sharded_mlp(ctx.world_size, seed=ctx.seed)
    for _ in _train(ctx, model, steps):
        pass
    path = os.path.join(ctx.shared_dir, "dcp-ckpt")
    if who == "every" or ctx.rank == 0:
        dcp.save({"model": model.state_dict()}, checkpoint_id=path)
    dist.barrier()
    return [full_digest(model), full_digest(_load_into_fresh(ctx, path))]


@ddpfaults.scenario(
    world_size=4,
    faults=[CheckpointNotVisible(rank=DIVERGED, step=2)],
    stall=SAFE_STALL,
    variants=[
        ddpfaults.variant(
            "naive",
            kwargs={"decide": "each"},
            expect=ddpfaults.Expect("crashed", rank=DIVERGED, root_cause=f"rank {DIVERGED} "),
        ),
        ddpfaults.variant(
            "fixed",
            kwargs={"decide": "rank0"},
            expect=ddpfaults.Expect("completed", values_equal=True, checks=(ROUND_TRIP,)),
        ),
    ],
)
def dcp_exists_check(ctx, decide, steps=2):
    """Train and save; then, as a restarted job would, resume from the checkpoint if one exists (each rank deciding,
    or rank 0 for all) and train a step; return the saved and the resumed full state's digests."""
    model = sharded_mlp(ctx.world_size, seed=ctx.seed)
    for _ in _train(ctx, model, steps):
        pass
    path = os.path.join(ctx.shared_dir, "dcp-ckpt")
    dcp.save({"model": model.state_dict()}, checkpoint_id=path)
    saved = full_digest(model)
    ctx.step(steps)
    resumed = sharded_mlp(ctx.world_size, seed=ctx.seed + 1)
    found = [os.path.exists(path)]  # every rank looks
    if decide == "rank0":
        dist.broadcast_object_list(found, src=0)
    if found[0]:
        state = {"model": resumed.state_dict()}
        dcp.load(state, checkpoint_id=path)
        resumed.load_state_dict(state["model"])
    loaded = full_digest(resumed)
    for _ in _train(ctx, resumed, 1, first=steps + 1):
        pass
    return [saved, loaded]


def _save(ctx, state, root, step, how):
    """Save ``state`` under ``root``: in place as ``latest``, or to a temporary directory renamed to ``step-N``."""
    if how == "inplace":
        dcp.save(state, checkpoint_id=os.path.join(root, "latest"))
        return
    final = os.path.join(root, f"step-{step}")
    temporary = f"{final}.tmp"
    dcp.save(state, checkpoint_id=temporary)
    dist.barrier()  # every rank's shard and the .metadata are written
    if ctx.rank == 0:
        shutil.rmtree(final, ignore_errors=True)
        os.replace(temporary, final)
    dist.barrier()


def _resume(ctx, root, how):
    """A fresh model resumed from the newest loadable checkpoint under ``root`` (a fresh start if none loads)."""
    if how == "inplace":
        try:
            return _load_into_fresh(ctx, os.path.join(root, "latest"))
        except Exception:  # the naive fallback: CheckpointException is a BaseException and passes through
            return sharded_mlp(ctx.world_size, seed=ctx.seed + 1)
    names = [n for n in os.listdir(root) if n.startswith("step-") and not n.endswith(".tmp")]
    for name in sorted(names, key=lambda n: int(n.split("-")[1]), reverse=True):
        try:
            return _load_into_fresh(ctx, os.path.join(root, name))
        except CheckpointException:  # raised on every rank alike: all fall back together
            continue
    return sharded_mlp(ctx.world_size, seed=ctx.seed + 1)


@ddpfaults.scenario(
    world_size=4,
    stall=SAFE_STALL,
    variants=[
        ddpfaults.variant(
            "naive",
            faults=[TornDcpWrite(writer=DIVERGED, step=1)],
            kwargs={"how": "inplace"},
            expect=ddpfaults.Expect("crashed", rank=DIVERGED, error="CheckpointException"),
        ),
        ddpfaults.variant(
            "fixed",
            faults=[TornDcpWrite(writer=DIVERGED, step=1)],
            kwargs={"how": "atomic"},
            expect=ddpfaults.Expect("completed", values_equal=True, checks=(ROUND_TRIP,)),
        ),
        ddpfaults.variant(
            "metadata_naive",
            faults=[TornDcpWrite(writer=0, step=1, part="metadata")],
            kwargs={"how": "inplace"},
            expect=ddpfaults.Expect("crashed", rank=0, error="CheckpointException"),
        ),
        ddpfaults.variant(
            "metadata_fixed",
            faults=[TornDcpWrite(writer=0, step=1, part="metadata")],
            kwargs={"how": "atomic"},
            expect=ddpfaults.Expect("completed", values_equal=True, checks=(ROUND_TRIP,)),
        ),
    ],
)
def dcp_torn(ctx, how, steps=2):
    """Train, saving after every step (in place, or atomically); then resume a fresh model from the newest
    checkpoint that loads; return the digest saved at the step it resumed from and the resumed one."""
    model = sharded_mlp(ctx.world_size, seed=ctx.seed)
    root = os.path.join(ctx.shared_dir, "dcp-ckpts")
    saved = {}
    for step in _train(ctx, model, steps):
        _save(ctx, {"model": model.state_dict()}, root, step, how)
        saved[step] = full_digest(model)
    ctx.step(steps)
    loaded = full_digest(_resume(ctx, root, how))
    good = [d for d in saved.values() if d == loaded]
    return [good[0] if good else saved[steps - 1], loaded]


def _pointer(ctx, name=None):
    """The ``latest`` pointer file under the shared directory: written (by rank 0) when ``name`` is given, else read."""
    path = os.path.join(ctx.shared_dir, "latest.txt")
    if name is None:
        with open(path) as f:
            return f.read()
    if ctx.rank == 0:
        with open(f"{path}.tmp", "w") as f:
            f.write(name)
        os.replace(f"{path}.tmp", path)
    return name


def _probe(ctx) -> str:
    """A peer died: what a restarted job would find where the ``latest`` pointer points (no collective: the world is
    broken), as the rank logs it: ``resume: resumed dcp-step-0`` or ``resume: lost dcp-step-1``."""
    name = _pointer(ctx)
    durable = os.path.isfile(os.path.join(ctx.shared_dir, name, ".metadata"))
    found = f"resume: {'resumed' if durable else 'lost'} {name}"
    ctx.log(found)
    return found


def _restart_finds(word: str) -> Check:
    """Rank 0, which writes the ``latest`` pointer and probes only after its own last write, logged that a restart
    would find the pointer's checkpoint ``word``. (The other survivors probe too, but may fail, and probe, before
    rank 0 has advanced the pointer: their view races with it.)"""

    def fn(result):
        found = [e["msg"] for e in result.ranks[0].events if e.get("k") == "log" and e["msg"].startswith("resume:")]
        return None if found and found[0].startswith(f"resume: {word} ") else f"rank 0 found: {found}"

    return Check(f"a restart finds the latest pointer's checkpoint {word}", fn)


@ddpfaults.scenario(
    world_size=4,
    faults=[AsyncSaveKilled(writer=DIVERGED, step=1)],
    stall=SAFE_STALL,
    variants=[
        ddpfaults.variant(
            "naive",
            kwargs={"await_it": False},
            expect=expect(f"crashed on rank {DIVERGED}", _restart_finds("lost"), root_cause="was killed by SIGKILL"),
        ),
        ddpfaults.variant(
            "fixed",
            kwargs={"await_it": True},
            expect=expect(f"crashed on rank {DIVERGED}", _restart_finds("resumed"), root_cause="was killed by SIGKILL"),
        ),
    ],
)
def dcp_async_save(ctx, await_it, steps=3):
    """Train, starting a ``dcp.async_save`` (on a checkpoint group of its own) after every step and advancing the
    ``latest`` pointer to it: at once (naive), or once its future completed, awaited before the next save (fixed).
    A peer's death ends training: each survivor logs what the pointer leads to, and raises."""
    model = sharded_mlp(ctx.world_size, seed=ctx.seed)
    group = dist.new_group(backend="gloo")
    pending = None
    _pointer(ctx, "none")
    try:
        for step in _train(ctx, model, steps):
            if pending is not None and await_it:
                pending[0].result()
                _pointer(ctx, pending[1])
            name = f"dcp-step-{step}"
            future = dcp.async_save(
                {"model": model.state_dict()}, checkpoint_id=os.path.join(ctx.shared_dir, name), process_group=group
            )
            pending = (future, name)
            if not await_it:
                _pointer(ctx, name)
        if await_it:
            pending[0].result()
            _pointer(ctx, pending[1])
    except (RuntimeError, CheckpointException) as exc:  # a peer is gone (CheckpointException caught by name)
        if isinstance(exc, RuntimeError) and "Connection" not in str(exc):
            raise
        _probe(ctx)
        raise  # the rank exits, and a peer waiting on it (not on the dead rank) fails in turn
    return _pointer(ctx)
