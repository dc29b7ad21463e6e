"""Two seed scenarios as the training scripts a team launches with ``torchrun``: no ``ctx``, no ddpfaults
calls; faults act at torch's seams (the DataLoader, ``torch.save``/``torch.load``) and steps are counted by
optimizer steps. Each variant's verdict equals its ``fn(ctx)`` counterpart's, except where torchrun's
semantics differ, as measured:

- ``empty_batch[skip_backward]``: the empty rank ``continue`` s past backward, runs out of batches a step
  early and *exits* (a torchrun worker ends with its script); its peers, in their last gradient all_reduce,
  get "Connection closed by peer". Under ``run_world`` the early rank's process stays up, so the same code is
  a hang there. Both name rank 1.
- ``checkpoint``: the save after the second optimizer step is at step 2 on the optimizer clock (``fn(ctx)``
  announces that iteration as step 1).
"""

import ddpfaults
from _checks import HANG_STALL, REPLICAS_EQUAL, SAFE_STALL, expect
from ddpfaults.faults import EmptyBatch, TornCheckpointWrite

READERS_TORN = ddpfaults.Check(
    "every reader raised the torn-read error",
    lambda r: (
        None
        if all("failed finding central directory" in (x.error or "") for x in r.ranks[1:])
        else f"reader errors: {[x.error for x in r.ranks[1:]]}"
    ),
)


empty_batch = ddpfaults.script_scenario(
    "scripts/train_empty_batch.py",
    name="empty_batch_script",
    world_size=4,
    faults=[EmptyBatch(rank=1, step=1)],
    stall=SAFE_STALL,
    variants=[
        ddpfaults.variant(
            "early_return",
            argv=["--strategy", "early_return", "--local-criterion"],
            expect=ddpfaults.Expect(
                "crashed", rank=1, error="RuntimeError", root_cause="Expected to have finished reduction"
            ),
        ),
        ddpfaults.variant(
            "early_return_find_unused",
            argv=["--strategy", "early_return", "--local-criterion", "--find-unused"],
            expect=expect("completed", REPLICAS_EQUAL),
        ),
        ddpfaults.variant(
            "criterion_skip",
            argv=["--strategy", "early_return", "--find-unused"],
            expect=ddpfaults.Expect("crashed", rank=1, collective="all_reduce", root_cause="collective mismatch"),
        ),
        ddpfaults.variant(
            "skip_backward",
            argv=["--strategy", "skip_backward", "--local-criterion"],
            stall=HANG_STALL,
            expect="crashed on rank 1 in all_reduce",
        ),
        ddpfaults.variant("fixed", argv=["--strategy", "fixed"], expect=expect("completed", REPLICAS_EQUAL)),
    ],
)

checkpoint = ddpfaults.script_scenario(
    "scripts/train_checkpoint.py",
    name="checkpoint_script",
    world_size=4,
    stall=SAFE_STALL,
    variants=[
        ddpfaults.variant(
            "torn_naive",
            faults=[TornCheckpointWrite(writer=0, step=2)],
            argv=["--save", "inplace", "--sync", "none"],
            expect=expect("crashed with RuntimeError", READERS_TORN, root_cause="failed finding central directory"),
        ),
        ddpfaults.variant(
            "torn_fixed",
            faults=[TornCheckpointWrite(writer=0, step=2)],
            argv=["--save", "atomic", "--sync", "barrier"],
            expect=expect("completed", REPLICAS_EQUAL),
        ),
        ddpfaults.variant(
            "rank0_barrier", argv=["--sync", "rank0"], stall=HANG_STALL, expect="hung on rank 0 in barrier"
        ),
    ],
)
