"""Report 002: rank 0 writes ``best_stg1.pth`` while the other ranks reload their EMA from it.

Measured on gloo (what the variants assert):

- ``torn_naive``: rank 0 saves in place, the others load at once. ``TornCheckpointWrite`` holds the
  file on disk torn (half its bytes) until every reader has read it: each reader raises "PytorchStreamReader failed
  reading zip archive: failed finding central directory" (symptom A). Without the fault the same code fails
  at random (FileNotFoundError, EOFError, zip errors), which is why the fault exists.
- ``torn_fixed``: temp file + ``os.replace``, then barrier / load / barrier: the temp file is held torn before its
  rename while the readers wait in the barrier, never seen; every rank loads the identical state.
- ``killed_naive`` / ``killed_fixed``: rank 0 is SIGKILLed halfway through its second save. The world
  crashes either way (rank 0 died); each survivor, waiting for the writer's point-to-point "saved"
  message, gets "Connection closed by peer", then probes the checkpoint on disk as a restarted job
  would and returns what it found: an in-place save lost it (torn file), an atomic save kept the
  last good one. Synchronising alone does not protect a checkpoint. Rarely a reader does not survive the
  writer's death either: it was killed by SIGSEGV (1 world in about 60; the cause, a signal-driven stack dump
  as the ranks failed, is gone: stacks are now dumped by a rank thread on request), so
  "every survivor" means the readers that finished, at least one. (The survivors wait on the writer
  directly, not in a barrier: gloo's barrier routes through peers, so a survivor that caught the error
  could leave another one blocked — measured.)
- ``rank0_barrier``: ``dist.barrier()`` indented under ``if rank == 0``: rank 0 waits forever while the
  others finish — a hang (symptom B's 30-minute gloo timeout, found here in about a second).
"""

import os
import time

import torch
import torch.distributed as dist

import ddpfaults
from _checks import HANG_STALL, SAFE_STALL, Check, expect, value_check
from ddpfaults import remedies
from ddpfaults.faults import TornCheckpointWrite, WriterKilledMidSave
from ddpfaults.toy.models import MLP, regression_step, state_digest

WRITER = 0
READERS_TORN = Check(
    "every reader raised the torn-read error",
    lambda r: (
        None
        if all("failed finding central directory" in (x.error or "") for x in r.ranks[1:])
        else f"reader errors: {[x.error for x in r.ranks[1:]]}"
    ),
)


def _survivors(values) -> list:
    """What the readers that finished returned (a reader killed by a signal returns nothing)."""
    return [v for v in values[1:] if v is not None]


CHECKPOINT_LOST = value_check(
    "every survivor found the checkpoint torn (lost)",
    lambda values: (
        bool(_survivors(values))
        and all(v[0] == "lost" and "failed finding central directory" in v[1] for v in _survivors(values))
    ),
)
LAST_GOOD_KEPT = value_check(
    "every survivor resumed from the last good checkpoint",
    lambda values: (
        bool(_survivors(values))
        and all(v[0] == "resumed" and v[1] == v[2] for v in _survivors(values))
        and len({v[1] for v in _survivors(values)}) == 1
    ),
)


def _load(path, sync, rank):
    """The reload of the EMA from ``path`` by the given synchronisation strategy."""
    if sync == "barrier":
        return remedies.load_after_barrier(path)
    if sync == "commit":  # the writer tells each reader, point to point, that its save is complete
        flag = torch.ones(1)
        for reader in range(1, dist.get_world_size()) if rank == WRITER else ():
            dist.send(flag, dst=reader)
        if rank != WRITER:
            dist.recv(flag, src=WRITER)
    elif sync == "rank0":
        if rank == WRITER:
            dist.barrier()  # the bug: only rank 0 reaches this barrier
        while not os.path.exists(path):  # the others poll for the (atomically written) file
            time.sleep(0.005)
    return torch.load(path)


def _resume(path, last_good):
    """A peer died: resume, as a restarted job would, from whatever checkpoint is on disk."""
    try:
        resumed = torch.load(path)
    except Exception as exc:  # the probe reports what a restart would meet
        return ("lost", f"{type(exc).__name__}: {exc}"[:160], last_good)
    return ("resumed", state_digest(resumed), last_good)


@ddpfaults.scenario(
    world_size=4,
    stall=SAFE_STALL,
    variants=[
        ddpfaults.variant(
            "torn_naive",
            faults=[TornCheckpointWrite(writer=WRITER, step=1)],
            kwargs={"save": "inplace", "sync": "none"},
            expect=expect("crashed with RuntimeError", READERS_TORN, root_cause="failed finding central directory"),
        ),
        ddpfaults.variant(
            "torn_fixed",
            faults=[TornCheckpointWrite(writer=WRITER, step=1)],
            kwargs={"save": "atomic", "sync": "barrier"},
            expect=ddpfaults.Expect("completed", values_equal=True),
        ),
        ddpfaults.variant(
            "killed_naive",
            faults=[WriterKilledMidSave(writer=WRITER, step=2)],
            kwargs={"save": "inplace", "sync": "commit", "save_steps": (1, 2)},
            expect=expect("crashed on rank 0", CHECKPOINT_LOST, root_cause="was killed by SIGKILL"),
        ),
        ddpfaults.variant(
            "killed_fixed",
            faults=[WriterKilledMidSave(writer=WRITER, step=2)],
            kwargs={"save": "atomic", "sync": "commit", "save_steps": (1, 2)},
            expect=expect("crashed on rank 0", LAST_GOOD_KEPT, root_cause="was killed by SIGKILL"),
        ),
        ddpfaults.variant(
            "rank0_barrier",
            faults=[],
            stall=HANG_STALL,
            kwargs={"save": "atomic", "sync": "rank0", "save_steps": (2,)},
            expect="hung on rank 0 in barrier",
        ),
    ],
)
def checkpoint(ctx, save, sync, save_steps=(1,), steps=3):
    """Train an MLP; at ``save_steps`` rank 0 saves the model and every rank reloads its EMA copy from disk."""
    model = MLP(seed=ctx.seed)
    ddp = ctx.ddp(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    ema = MLP(seed=ctx.seed + 1)
    path = os.path.join(ctx.shared_dir, "best_stg1.pth")
    last_good = None
    for step in range(steps):
        regression_step(ctx, ddp, optimizer, step)
        if step not in save_steps:
            continue
        if ctx.rank == WRITER:
            state = {k: v.clone() for k, v in model.state_dict().items()}
            torch.save(state, path) if save == "inplace" else remedies.atomic_save(state, path)
        try:
            ema.load_state_dict(_load(path, sync, ctx.rank))
        except RuntimeError as exc:
            if "Connection closed by peer" not in str(exc) and "Connection reset by peer" not in str(exc):
                raise
            return _resume(path, last_good)
        last_good = state_digest(ema)
    return state_digest(ema)
