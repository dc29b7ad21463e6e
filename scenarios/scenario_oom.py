"""Issue 15: one rank runs out of memory mid-training (a batch too large for its host).

``OutOfMemory(rank=1, step=1)`` limits rank 1's address space when step 1 starts, so the step's activation
workspace (64 MiB, allocated on every rank before the forward pass) fails there as on a host out of memory.
Measured on gloo (what the variants assert):

- ``naive``: the error escapes rank 1's trainer: ``RuntimeError: [enforce fail at alloc_cpu.cpp] ...
  DefaultCPUAllocator: can't allocate memory ... Error code 12`` (torch's CPU allocator; numpy raises
  ``MemoryError`` instead). Its peers, waiting in the step's gradient all_reduce, get "Connection closed by peer":
  a crash, not a hang, named as rank 1's allocation.
- ``naive_linger``: the same with the failed rank's sockets kept open (NCCL-like): its peers hang in the
  gradient all_reduce.
- ``fixed``: the trainer catches the out-of-memory error and every rank all_reduces a "my step failed" flag
  (:func:`ddpfaults.remedies.any_rank`) before the forward pass: all ranks skip step 1 together and finish
  with bit-equal replicas.
"""

import torch
import torch.nn.functional as F

import ddpfaults
from _checks import HANG_STALL, SAFE_STALL
from ddpfaults import remedies
from ddpfaults.faults import OutOfMemory
from ddpfaults.toy.data import make_regression
from ddpfaults.toy.models import MLP, state_digest

OOM = OutOfMemory(rank=1, step=1)
#: the per-step activation workspace: more than OutOfMemory's margin, never touched (address space only)
WORKSPACE_BYTES = 64 * 2**20
NAIVE_ERROR = "DefaultCPUAllocator: can't allocate memory"


def is_out_of_memory(exc: BaseException) -> bool:
    """True for the errors a CPU host out of memory raises (torch's allocator, numpy, Python)."""
    return isinstance(exc, MemoryError) or (isinstance(exc, RuntimeError) and "can't allocate memory" in str(exc))


@ddpfaults.scenario(
    world_size=3,
    faults=[OOM],
    stall=SAFE_STALL,
    variants=[
        ddpfaults.variant(
            "naive",
            expect=ddpfaults.Expect("crashed", rank=1, error="RuntimeError", root_cause=NAIVE_ERROR),
        ),
        ddpfaults.variant(
            "naive_linger",
            peer_failure="linger",
            stall=HANG_STALL,
            expect=ddpfaults.Expect("hung", rank=1, error="RuntimeError", root_cause=NAIVE_ERROR),
        ),
        ddpfaults.variant("fixed", kwargs={"fixed": True}, expect=ddpfaults.Expect("completed", values_equal=True)),
    ],
)
def oom(ctx, fixed=False, steps=3):
    """Train the MLP; each step first allocates a large workspace (rank 1 is out of memory at step 1)."""
    model = MLP(seed=ctx.seed)
    ddp = ctx.ddp(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    skipped = []
    for step in range(steps):
        ctx.step(step)
        failed = False
        try:
            workspace = torch.empty(WORKSPACE_BYTES // 4)
        except Exception as exc:
            if not (fixed and is_out_of_memory(exc)):
                raise
            failed = True
        if fixed and remedies.any_rank(failed):
            skipped.append(step)
            continue  # every rank skips the step together: no collective is left unmatched
        del workspace
        x, y = make_regression(seed=ctx.seed, rank=ctx.rank, step=step)
        loss = F.mse_loss(ddp(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return {"digest": state_digest(model), "skipped": skipped}
