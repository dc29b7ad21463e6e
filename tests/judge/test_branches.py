"""Unit tests of ddpfaults.judge.live.branches (a rank's frames read against their source) and the attribution's
rank-conditional evidence: hand-built rank results over a source file written for the test."""

import textwrap
import traceback as tb

from ddpfaults.judge.attribution import attribute, branch_evidence, culprits
from ddpfaults.judge.live import branches
from ddpfaults.judge.results import Collective, Divergence, DivergenceGroup, RankResult, RankState

SOURCE = textwrap.dedent(
    """\
    import torch.distributed as dist


    def main(trainer, rank):
        for step in range(5):
            train(step)
            if trainer.is_world_process_zero():
                trainer.evaluate()
            if rank == 0:
                print("saving")
            else:
                dist.barrier()
            if step == 3:
                dist.barrier()
    """
)
TORCH = '  File "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 5356 in barrier\n'


def stack(path, *frames):
    """A faulthandler dump: a torch frame innermost, then ``frames`` ((line, function), innermost first)."""
    lines = [f'  File "{path}", line {line} in {fn}\n' for line, fn in frames]
    return "Thread 0x1 (most recent call first):\n" + TORCH + "".join(lines)


def test_a_frame_inside_a_branch_on_the_rank_is_found_in_a_stack_or_a_traceback(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(SOURCE)
    blocked = RankResult(0, RankState.BLOCKED, stack=stack(path, (8, "main"), (20, "<module>")))
    assert branches.rank_branch(blocked) == branches.Branch("train.py:8 in main", "if trainer.is_world_process_zero()")
    otherwise = RankResult(1, RankState.BLOCKED, stack=stack(path, (12, "main")))
    assert branches.rank_branch(otherwise) == branches.Branch("train.py:12 in main", "if rank == 0", taken=False)
    assert branches.rank_branch(otherwise).describe() == "the else of `if rank == 0` at train.py:12 in main"
    traceback = f'Traceback (most recent call last):\n  File "{path}", line 8, in main\n' + TORCH
    assert branches.rank_branch(RankResult(0, RankState.RAISED, traceback=traceback)).site == "train.py:8 in main"


def test_a_raised_rank_s_stack_taken_while_it_formatted_its_traceback_gives_way_to_the_traceback(tmp_path):
    """A rank that raised out of ``trainer.evaluate()`` (its peers gone) was dumped already in ddpfaults' handler,
    formatting the exception: no frame of the code there; its traceback still shows the branch (seen in a real
    4-rank Hugging Face Trainer world, where the branch then went missing from the root cause)."""
    path = tmp_path / "train.py"
    path.write_text(SOURCE)
    formatting = (
        "Thread 0x1 (most recent call first):\n"
        f'  File "{tb.__file__}", line 184 in format_exc\n'
        f'  File "{branches.__file__}", line 96 in run_job\n'
    )
    traceback = f'Traceback (most recent call last):\n  File "{path}", line 8, in main\n' + TORCH
    raised = RankResult(0, RankState.RAISED, stack=formatting, traceback=traceback)
    assert branches.rank_branch(raised) == branches.Branch("train.py:8 in main", "if trainer.is_world_process_zero()")
    blocked = RankResult(0, RankState.BLOCKED, stack=stack(path, (14, "main")), traceback=traceback)
    assert branches.rank_branch(blocked) is None  # a stack in the code is what the rank was doing: not in a branch


def test_a_frame_in_no_branch_on_the_rank_or_in_a_library_or_an_unreadable_file_is_none(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(SOURCE)
    assert branches.rank_branch(RankResult(0, RankState.BLOCKED, stack=stack(path, (14, "main")))) is None  # step
    assert branches.rank_branch(RankResult(0, RankState.BLOCKED, stack=stack(path, (6, "main")))) is None
    assert branches.rank_branch(RankResult(0, RankState.BLOCKED, stack=stack(tmp_path / "gone.py", (8, "f")))) is None
    assert branches.rank_branch(RankResult(0, RankState.FINISHED)) is None
    assert not branches.is_user_file("/venv/lib/python3.11/site-packages/accelerate/utils/operations.py")
    assert not branches.is_user_file(branches.__file__) and branches.is_user_file(str(path))


def test_the_rank_alone_inside_a_branch_on_its_rank_is_named_one_against_one():
    inside = {0: branches.Branch("train.py:14 in main", "if rank == 0")}
    ranks = [RankResult(0, RankState.BLOCKED), RankResult(1, RankState.BLOCKED)]
    found = branch_evidence(ranks, inside)
    assert found.ranks == (0,)
    assert (
        found.shows == "rank 0 stood inside a branch on its rank, `if rank == 0` at train.py:14 in main; rank 1 in none"
    )
    assert branch_evidence(ranks, {**inside, 1: inside[0]}) is None  # both inside: nothing to tell them apart
    assert branch_evidence(ranks, {}) is None
    assert culprits(ranks, (), inside).ranks == (0,)
    divergence = Divergence(9, (DivergenceGroup((0,), None, "x"), DivergenceGroup((1,), None, "y")), ())
    judged = attribute(divergence, ranks, (), inside)
    assert judged.odd_ranks == (0,) and judged.basis == found.shows
    assert attribute(divergence, ranks).odd_ranks == ()  # without it: nothing shows which diverged


def test_the_ranks_seen_outside_a_block_most_ranks_stand_inside_are_named():
    """``if not (rank == 1 and step == 1): all_reduce(...)``: ranks 2 and 3 wait inside it, rank 1 is seen outside
    it (its frames known, in no branch), rank 0 is dead (gloo aborted it: no frames, on neither side)."""
    block = branches.Branch("train.py:9 in main", "if not (rank == 1 and step == 1)")
    inside = {1: None, 2: block, 3: block}
    ranks = [RankResult(0, RankState.DIED)] + [RankResult(r, RankState.BLOCKED) for r in (1, 2, 3)]
    found = branch_evidence(ranks, inside)
    assert found.ranks == (1,)
    assert found.shows == (
        "rank 1 stood outside a branch on the rank that ranks 2, 3 stood inside, "
        "`if not (rank == 1 and step == 1)` at train.py:9 in main"
    )
    one_against_one = branch_evidence(ranks[:2], {0: block, 1: None})
    assert one_against_one.ranks == (0,), "a tie: the rank inside, as for code on rank 0 only"
    other = branches.Branch("train.py:20 in main", "if rank != 1")
    assert branch_evidence(ranks, {1: None, 2: block, 3: other}).ranks == (2, 3), "two branches: no one block"
    assert branch_evidence(ranks, {2: block, 3: block}).ranks == (2, 3), "nobody seen outside: the old rule"


def _calls(*made):
    """A rank's collectives: (op, site, step) each."""
    return [Collective(seq=n, op=op, shapes=[[1]], site=site, step=step) for n, (op, site, step) in enumerate(made, 1)]


def test_one_against_one_the_rank_that_ran_a_block_before_and_left_it_at_one_step_is_named():
    """Two ranks, ``if not (rank == 1 and step == 1): all_reduce(num)`` at train.py:14 inside the step loop, DDP's
    bucket at train.py:11: rank 0 stands inside the block at step 1, rank 1 (seen outside, in backward at step 2)
    made a collective in it at step 0 and none at step 1. Its own history names it; a rank-0-only barrier, which
    rank 1 never ran, still names rank 0; a block rank 1 ran at every step it reached names no one."""
    block = branches.Branch("train.py:14 in main", "if not (rank == 1 and step == 1)", True, ("train.py", 14, 14))
    bucket, reduce = ("all_reduce", "train.py:11 in main"), ("all_reduce", "train.py:14 in main")
    rank0 = RankResult(0, RankState.DIED, collectives=_calls((*bucket, 0), (*reduce, 0), (*bucket, 1), (*reduce, 1)))
    rank1 = RankResult(1, RankState.RAISED, collectives=_calls((*bucket, 0), (*reduce, 0), (*bucket, 1), (*bucket, 2)))
    found = branch_evidence([rank0, rank1], {0: block, 1: None})
    assert found.ranks == (1,)
    assert found.shows == (
        "in step 1 rank 1 made no collective inside `if not (rank == 1 and step == 1)` at train.py:14 in main, "
        "as it did in step 0 and rank 0 did in step 1"
    )
    barrier = branches.Branch("train.py:20 in main", "if rank == 0", True, ("train.py", 20, 20))
    rank0_only = RankResult(
        0, RankState.BLOCKED, collectives=_calls((*bucket, 0), ("barrier", "train.py:20 in main", 0))
    )
    waiting = RankResult(1, RankState.BLOCKED, collectives=_calls((*bucket, 0), (*bucket, 1)))
    assert branch_evidence([rank0_only, waiting], {0: barrier, 1: None}).ranks == (0,)
    steady = RankResult(
        1, RankState.BLOCKED, collectives=_calls((*bucket, 0), (*reduce, 0), (*bucket, 1), (*reduce, 1))
    )
    assert branch_evidence([rank0, steady], {0: block, 1: None}) is None
