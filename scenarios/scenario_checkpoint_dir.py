"""The checkpoint directory: every rank writing it at once, and rank 0 failing to make it while the others wait.

Every variant trains an MLP and saves at steps 1 and 2 into ``checkpoints/model.pth``; every rank then
reloads it after a barrier (:func:`ddpfaults.remedies.load_after_barrier`, as ``scenario_checkpoint``'s
fixed variant does). Measured on gloo, 3 ranks, 5 runs each plus the soak (what the variants assert):

- ``all_mkdir``: every rank ``os.makedirs(dir)`` (no ``exist_ok``) at once: ``mkdir`` is atomic, so exactly
  one rank wins and the other two get ``FileExistsError`` at the first save. Left uncaught (as in the field)
  the world crashes every time, the winner getting "Connection closed by peer" in the barrier, but the race
  decides which ranks raise: the root cause named rank 0 in 5 of 11 runs and rank 1 in the other 6. A case
  must have one verdict and one root-cause rank, so this variant catches the error where it is raised and
  returns, gathered on every rank, who created the directory and who raised: it completes, and asserts
  that exactly one rank created it (6 of 6 runs, and under the soak).
- ``all_save``: every rank ``os.makedirs(dir, exist_ok=True)`` and ``torch.save`` s to the same file at once:
  nothing happens. The world completes, every rank loads exactly the model it trained. Replicas are
  bit-equal, so the concurrent writers write identical bytes. (Outside the matrix, 3 processes saving
  *different* states to one path at once, 130 rounds of 16 KiB and 8 MiB files on this machine's /tmp:
  the file was never torn, the last writer's state won whole.)
- ``partial_exit``: rank 0 alone makes the directory without ``exist_ok``; at the second save it already
  exists, rank 0 raises ``FileExistsError`` while ranks 1-2 wait in the barrier. On gloo they get
  "Connection closed by peer" / "Connection reset by peer" as soon as rank 0 exits: a crash, not a hang.
- ``partial_linger``: the same with ``peer_failure="linger"`` (a failed rank keeps its sockets, as under
  NCCL): ranks 1-2 wait in the barrier forever: hung, root cause rank 0's ``FileExistsError``.
- ``shared_error_linger``: rank 0 saves through :func:`ddpfaults.remedies.on_rank0`, still without
  ``exist_ok``: its error is broadcast and every rank raises the same ``FileExistsError`` together, so even
  lingering (NCCL-like) the world crashes at once instead of hanging.
- ``fixed``: rank 0 alone makes the directory with ``exist_ok=True`` and saves atomically
  (:func:`~ddpfaults.remedies.atomic_save`) inside :func:`~ddpfaults.remedies.on_rank0`; the others wait
  for it, then all load after a barrier: completed, replicas bit-equal, each equal to the loaded checkpoint.

Field claims the measurements contradict: NeMo Automodel issue #3254 reports rank 0's ``FileExistsError``
as a hang; on gloo the peers crash with "Connection closed by peer" within a second of rank 0's exit —
it is a hang only where a failed rank's process lingers (NCCL, or a launcher that keeps it alive). And every
rank saving the same checkpoint "corrupts it": on a local filesystem with equal replicas it does not
(the wasted I/O is the only cost); it is ``os.makedirs`` without ``exist_ok`` on every rank that kills the job.
"""

import os

import torch
import torch.distributed as dist

import ddpfaults
from _checks import HANG_STALL, SAFE_STALL, every_rank_errors, expect, others_blocked_in, raised_by, value_check
from ddpfaults import remedies
from ddpfaults.toy.models import MLP, regression_step, state_digest

WORLD = 3
FILE_EXISTS = "FileExistsError"
ONE_CREATOR = value_check(
    f"one rank created the directory, the other {WORLD - 1} raised FileExistsError",
    lambda values: values[0] is not None and sorted(values[0]) == [FILE_EXISTS] * (WORLD - 1) + ["created"],
)
LOADED_WHAT_IT_TRAINED = value_check(
    "every rank loaded exactly the model it trained",
    lambda values: all(v is not None and v[0] == v[1] for v in values),
)


def _save(state, directory, exist_ok, atomic):
    """Make the checkpoint directory and save ``state`` into it, as a trainer's save_checkpoint does."""
    os.makedirs(directory, exist_ok=exist_ok)
    path = os.path.join(directory, "model.pth")
    remedies.atomic_save(state, path) if atomic else torch.save(state, path)
    return path


def _mkdir_race(directory) -> list:
    """Every rank ``os.makedirs(directory)`` at once (no ``exist_ok``); gathered: per rank, "created" or the
    error it raised."""
    try:
        os.makedirs(directory)
        outcome = "created"
    except OSError as exc:
        outcome = type(exc).__name__
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, outcome)
    return gathered


@ddpfaults.scenario(
    world_size=WORLD,
    stall=SAFE_STALL,
    variants=[
        ddpfaults.variant(
            "all_mkdir",
            kwargs={"writers": "all", "exist_ok": False, "probe": True},
            expect=expect("completed", ONE_CREATOR, values_equal=True),
        ),
        ddpfaults.variant(
            "all_save",
            kwargs={"writers": "all", "exist_ok": True},
            expect=expect("completed", LOADED_WHAT_IT_TRAINED, values_equal=True),
        ),
        ddpfaults.variant(
            "partial_exit",
            kwargs={"writers": "rank0", "exist_ok": False},
            expect=expect("crashed with FileExistsError on rank 0", raised_by(FILE_EXISTS, 1)),
        ),
        ddpfaults.variant(
            "partial_linger",
            peer_failure="linger",
            stall=HANG_STALL,
            kwargs={"writers": "rank0", "exist_ok": False},
            expect=expect("hung with FileExistsError on rank 0", others_blocked_in("barrier", 0)),
        ),
        ddpfaults.variant(
            "shared_error_linger",
            peer_failure="linger",
            kwargs={"writers": "rank0", "exist_ok": False, "shared": True},
            expect=expect("crashed with FileExistsError on rank 0", every_rank_errors(FILE_EXISTS)),
        ),
        ddpfaults.variant(
            "fixed",
            kwargs={"writers": "rank0", "exist_ok": True, "shared": True},
            expect=expect("completed", LOADED_WHAT_IT_TRAINED, values_equal=True),
        ),
    ],
)
def checkpoint_dir(ctx, writers, exist_ok, shared=False, probe=False, save_steps=(1, 2), steps=3):
    """Train an MLP; at ``save_steps`` the ``writers`` ("all" ranks, or "rank0") make ``checkpoints/`` and
    save the model into it, then every rank reloads it after a barrier (``shared``: rank 0 saves through
    :func:`~ddpfaults.remedies.on_rank0`, atomically, and every rank learns whether it worked). Returns the
    digests of the loaded checkpoint and of the trained model (``probe``: at the first save, every rank's
    outcome of making the directory)."""
    model = MLP(seed=ctx.seed)
    ddp = ctx.ddp(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    directory = os.path.join(ctx.shared_dir, "checkpoints")
    path = os.path.join(directory, "model.pth")
    loaded = None
    for step in range(steps):
        regression_step(ctx, ddp, optimizer, step)
        if step not in save_steps:
            continue
        state = {k: v.clone() for k, v in model.state_dict().items()}
        if probe:
            return _mkdir_race(directory)
        if shared:
            remedies.on_rank0(_save, state, directory, exist_ok, True)
        elif writers == "all" or ctx.rank == 0:
            _save(state, directory, exist_ok, False)
        loaded = remedies.load_after_barrier(path)
    return state_digest(loaded), state_digest(model)
