"""Unit tests of ddpfaults.judge.verdict: pure functions over hand-built rank results (no processes)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from ddpfaults.judge.results import Collective, DivergenceGroup, Outcome, RankResult, RankState
from ddpfaults.judge.verdict import (
    Divergence,
    first_divergence,
    format_ranks,
    innermost_frame,
    is_collateral,
    is_waiting_stack,
    mark_collateral,
    root_cause,
    world_outcome,
)

# -- realistic error texts -----------------------------------------------------------------

GLOO_CLOSED = (
    "RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] "
    "Connection closed by peer [127.0.0.1]:8620. This may indicate a possible application crash "
    "on rank 0 or a network set up issue."
)
GLOO_RESET = (
    "RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:534] "
    "Read error [127.0.0.1]:8620: Connection reset by peer"
)
GLOO_TIMEOUT = (
    "RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] "
    "Timed out waiting 5000ms for recv operation to complete"
)
GLOO_PAIR_TIMEOUT = (
    "RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:598] "
    "Application timeout caused pair closure"
)
KEY_ERROR = "KeyError: 'segment_mask'"
DDP_REDUCTION = (
    "RuntimeError: Expected to have finished reduction in the prior iteration before starting a new one. "
    "This error indicates that your module has parameters that were not used in producing loss. You can "
    "enable unused parameter detection by passing the keyword argument `find_unused_parameters=True` to "
    "`torch.nn.parallel.DistributedDataParallel`, and by making sure all `forward` function outputs "
    "participate in calculating loss. If you already have done the above, then the distributed data "
    "parallel module wasn't able to locate the output tensors in the return value of your module's "
    "`forward` function. Please include the loss function and the structure of the return value of "
    "`forward` of your module when reporting this issue (e.g. list, dict, iterable).\n"
    "Parameter indices which did not receive grad for rank 1: 2 3\n"
    " In addition, you can set the environment variable TORCH_DISTRIBUTED_DEBUG to either INFO or DETAIL "
    "to print out information about which particular parameters did not receive gradient on this rank as "
    "part of this error"
)
DDP_DEVICE_IDS = (
    "ValueError: DistributedDataParallel device_ids and output_device arguments only work with "
    "single-device/multiple-device GPU modules or CPU modules, but got device_ids [0], output_device 0, "
    "and module parameters {device(type='cpu')}."
)


# -- helpers -------------------------------------------------------------------------------


def coll(
    seq: int,
    step: int | None,
    op: str = "all_reduce",
    shapes=None,
    site: str = "train.py:31 in train_step",
    done: bool = True,
) -> Collective:
    return Collective(seq=seq, op=op, shapes=[[4]] if shapes is None else shapes, site=site, step=step, done=done)


def seq_of(steps, **kw) -> list[Collective]:
    """One collective per step, seq numbered from 1."""
    return [coll(i + 1, s, **kw) for i, s in enumerate(steps)]


def rank(r: int, state: RankState = RankState.FINISHED, collectives=None, **kw) -> RankResult:
    return RankResult(rank=r, state=state, collectives=list(collectives or []), **kw)


def test_ddp_internal_calls_from_different_lines_match_but_user_calls_do_not():
    """A rank that runs forward from another line (an empty batch's zero loss) makes the same DDP broadcast."""
    broadcast = {"op": "broadcast", "shapes": [[5]], "step": 1}
    at = [
        Collective(
            seq=1, site=f"train.py:{line} in main", note="DDP forward broadcast", maker="ddp_forward", **broadcast
        )
        for line in (48, 50)
    ]
    assert first_divergence([rank(0, collectives=[at[0]]), rank(1, collectives=[at[1]])]) is None
    user = [dataclasses.replace(c, note="", maker="user") for c in at]
    assert first_divergence([rank(0, collectives=[user[0]]), rank(1, collectives=[user[1]])]) is not None


def test_records_cut_by_the_ring_buffer_at_different_points_are_compared_where_both_reach():
    """Rank 1 finished after collective #8133; rank 0 went on into #8134. Torch's ring buffer kept each rank's last
    4000 entries, so rank 0's record starts at #4135 and rank 1's at #4134, one step apart: compared by position
    every pair differed (a divergence at "#1"); compared by number they agree up to #8133, and rank 1 never made
    #8134."""
    rank0 = [coll(seq, seq - 5, done=seq < 8134) for seq in range(4135, 8135)]
    rank1 = [coll(seq, seq - 5) for seq in range(4134, 8134)]
    d = first_divergence([rank(0, RankState.BLOCKED, rank0), rank(1, RankState.FINISHED, rank1)])
    assert d is not None and d.index == 8134
    assert [(g.ranks, g.call and g.call.step, g.absent) for g in d.groups] == [
        ((0,), 8129, None),
        ((1,), None, "finished"),
    ]


# -- is_collateral --------------------------------------------------------------------------


@pytest.mark.parametrize("text", [GLOO_CLOSED, GLOO_RESET, GLOO_TIMEOUT, GLOO_PAIR_TIMEOUT])
def test_gloo_peer_failure_messages_are_collateral(text):
    assert is_collateral(text) is True


@pytest.mark.parametrize("text", [KEY_ERROR, DDP_REDUCTION, DDP_DEVICE_IDS, "RuntimeError: injected crash"])
def test_own_errors_are_not_collateral(text):
    assert is_collateral(text) is False


@pytest.mark.parametrize("text", [None, ""])
def test_missing_error_is_not_collateral(text):
    assert is_collateral(text) is False


# -- innermost_frame / is_waiting_stack ---------------------------------------------------

STACK_ALL_REDUCE = """\
Thread 0x00007f3a5c1fd740 (most recent call first):
  File "/usr/local/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 3203 in all_reduce
  File "/usr/local/lib/python3.11/site-packages/torch/distributed/c10d_logger.py", line 81 in wrapper
  File "/work/main/ddpfaults/rank/main.py", line 120 in traced
  File "/work/scenarios/criterion.py", line 42 in loss
  File "/work/scenarios/train.py", line 31 in train_step
  File "/work/main/ddpfaults/rank/main.py", line 280 in _run
  File "/work/main/ddpfaults/rank/main.py", line 330 in main"""

STACK_BACKWARD = """\
Current thread 0x00007f3a5c1fd740 (most recent call first):
  File "/usr/local/lib/python3.11/site-packages/torch/autograd/graph.py", line 829 in _engine_run_backward
  File "/usr/local/lib/python3.11/site-packages/torch/autograd/__init__.py", line 347 in backward
  File "/usr/local/lib/python3.11/site-packages/torch/_tensor.py", line 647 in backward
  File "/work/scenarios/train.py", line 33 in train_step
  File "/work/main/ddpfaults/rank/main.py", line 280 in _run"""

STACK_DDP_FORWARD = """\
Thread 0x00007f3a5c1fd740 (most recent call first):
  File "/usr/local/lib/python3.11/site-packages/torch/nn/parallel/distributed.py", line 1612 in _pre_forward
  File "/usr/local/lib/python3.11/site-packages/torch/nn/parallel/distributed.py", line 1654 in forward
  File "/usr/local/lib/python3.11/site-packages/torch/nn/modules/module.py", line 1784 in _call_impl
  File "/work/scenarios/train.py", line 30 in train_step"""

# time.sleep is C code: faulthandler shows the user frame that called it as the innermost one
STACK_SLEEPING = """\
Thread 0x00007f3a5c1fd740 (most recent call first):
  File "/work/scenarios/train.py", line 12 in slow_step
  File "/work/scenarios/train.py", line 29 in train_step
  File "/usr/local/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 3203 in all_reduce
  File "/work/main/ddpfaults/rank/main.py", line 280 in _run"""

STACK_COMPUTING = """\
Thread 0x00007f3a5c1fd740 (most recent call first):
  File "/usr/local/lib/python3.11/site-packages/torch/nn/modules/linear.py", line 134 in forward
  File "/usr/local/lib/python3.11/site-packages/torch/nn/modules/module.py", line 1784 in _call_impl
  File "/work/scenarios/train.py", line 30 in train_step"""


def test_innermost_frame_is_the_first_file_line_of_a_faulthandler_dump():
    frame = innermost_frame(STACK_ALL_REDUCE)
    assert frame is not None
    assert frame.startswith('File "')
    assert "distributed_c10d.py" in frame and frame.endswith("in all_reduce")


def test_innermost_frame_of_sleeping_stack_is_user_code():
    frame = innermost_frame(STACK_SLEEPING)
    assert frame == 'File "/work/scenarios/train.py", line 12 in slow_step'


@pytest.mark.parametrize(
    "stack", [None, "", "Thread 0x00007f3a5c1fd740 (most recent call first):\n  <no Python frame>"]
)
def test_innermost_frame_without_frames_is_none(stack):
    assert innermost_frame(stack) is None
    assert is_waiting_stack(stack) is False


@pytest.mark.parametrize("stack", [STACK_ALL_REDUCE, STACK_BACKWARD, STACK_DDP_FORWARD])
def test_stacks_inside_distributed_ddp_or_autograd_are_waiting(stack):
    assert is_waiting_stack(stack) is True


@pytest.mark.parametrize("stack", [STACK_SLEEPING, STACK_COMPUTING])
def test_stacks_in_user_code_or_plain_compute_are_not_waiting(stack):
    # STACK_SLEEPING has a torch/distributed frame further out: only the innermost one counts
    assert is_waiting_stack(stack) is False


# -- format_ranks / Divergence ---------------------------------------------------------------


def test_format_ranks():
    assert format_ranks([2]) == "rank 2"
    assert format_ranks([1, 0]) == "ranks 0, 1"
    assert format_ranks([3, 1, 2, 0]) == "ranks 0-3"
    assert format_ranks([0, 2, 3]) == "ranks 0, 2, 3"


def test_divergence_describe_names_index_and_groups():
    groups = (
        DivergenceGroup((0, 1, 2), Collective(5, "all_reduce", [[4]], "t.py:3 in f", 1)),
        DivergenceGroup((3,), Collective(5, "barrier", [], "t.py:9 in g", 1)),
    )
    d = Divergence(5, groups, (3,))
    assert d.describe() == (
        "collective #5: ranks 0-2 called all_reduce([4]) at t.py:3 in f (step 1); "
        "rank 3 called barrier() at t.py:9 in g (step 1)"
    )
    assert d.ops() == {"all_reduce", "barrier"}
    assert Divergence.from_dict(json.loads(json.dumps(dataclasses.asdict(d)))) == d


# -- first_divergence ----------------------------------------------------------------------


def test_identical_sequences_have_no_divergence():
    ranks = [rank(r, collectives=seq_of([0, 1, 2])) for r in range(4)]
    assert first_divergence(ranks) is None


def test_single_rank_world_has_no_divergence():
    assert first_divergence([rank(0, RankState.BLOCKED, seq_of([0, 1]))]) is None
    assert first_divergence([]) is None


def test_rank_that_skipped_a_collective_is_the_odd_rank():
    # ranks 0, 1, 3 call all_reduce at steps 0, 1, 2; rank 2 skipped step 1's: its 2nd call is step 2's
    ranks = [rank(r, RankState.BLOCKED, seq_of([0, 1, 2])) for r in (0, 1, 3)]
    ranks.insert(2, rank(2, RankState.BLOCKED, seq_of([0, 2])))
    d = first_divergence(ranks)
    assert d is not None
    assert d.index == 2  # 1-based position of the first disagreeing collective
    assert d.odd_ranks == (2,)
    assert d.groups[0].ranks == (0, 1, 3)  # largest group first
    assert d.groups[1].ranks == (2,)
    text = d.describe()
    assert text.startswith("collective #2: ")
    assert "(step 1)" in text and "(step 2)" in text
    assert "rank 2 called" in text


def test_different_call_site_is_a_divergence():
    ranks = [rank(r, RankState.BLOCKED, seq_of([0, 1])) for r in range(3)]
    ranks[1].collectives[0] = coll(1, 0, site="eval.py:9 in evaluate")
    d = first_divergence(ranks)
    assert d is not None and d.index == 1 and d.odd_ranks == (1,)
    assert "eval.py:9 in evaluate" in d.describe()


def test_rank_that_finished_early_is_described_as_finished():
    # rank 0 returned after 2 collectives; ranks 1-3 are blocked in a 3rd one
    ranks = [rank(0, RankState.FINISHED, seq_of([0, 1]))]
    ranks += [rank(r, RankState.BLOCKED, seq_of([0, 1, 2])) for r in (1, 2, 3)]
    d = first_divergence(ranks)
    assert d is not None
    assert d.index == 3
    assert d.odd_ranks == (0,)
    described = {g.ranks: g.text() for g in d.groups}
    assert described[(0,)] == "never called it (finished)"
    assert described[(1, 2, 3)].startswith("called all_reduce(")
    assert "rank 0 never called it (finished)" in d.describe()


def test_several_finished_ranks_form_one_group():
    # ranks 0-2 finished after 2 collectives; rank 3 alone entered a barrier
    ranks = [rank(r, RankState.FINISHED, seq_of([0, 1])) for r in range(3)]
    ranks.append(rank(3, RankState.BLOCKED, seq_of([0, 1]) + [coll(3, 1, op="barrier", shapes=[])]))
    d = first_divergence(ranks)
    assert d is not None and d.index == 3
    assert d.odd_ranks == (3,)
    assert {g.ranks: g.text() for g in d.groups}[(0, 1, 2)] == "never called it (finished)"


def test_running_rank_is_described_by_where_it_stood():
    ranks = [rank(0, RankState.RUNNING, seq_of([0]), where="train.py:12 in slow_step")]
    ranks += [rank(r, RankState.BLOCKED, seq_of([0, 1])) for r in (1, 2)]
    d = first_divergence(ranks)
    assert d is not None and d.odd_ranks == (0,)
    assert {g.ranks: g.text() for g in d.groups}[(0,)] == "never called it (was at train.py:12 in slow_step)"


def test_a_split_without_a_smallest_group_names_no_rank_by_vote():
    """2 against 2: no vote can tell which pair diverged (the evidence of what each did may: attribution)."""
    world = [rank(r, RankState.BLOCKED, seq_of([0, 1] if r < 2 else [0, 2])) for r in range(4)]
    d = first_divergence(world)
    assert d is not None and d.index == 2
    assert sorted(len(g.ranks) for g in d.groups) == [2, 2]
    assert d.odd_ranks == ()
    assert d.blame().startswith("ranks 0-3 disagree at collective #2 and nothing shows which diverged: ")
    assert root_cause(world, d, "stall")[0] is None


@pytest.mark.parametrize("state", [RankState.RAISED, RankState.DIED])
def test_crashed_rank_ending_early_is_not_a_divergence(state):
    ranks = [rank(r, RankState.BLOCKED, seq_of([0, 1, 2])) for r in range(4)]
    ranks[1] = rank(1, state, seq_of([0]), error="KeyError: 'segment_mask'")
    assert first_divergence(ranks) is None


def test_crashed_rank_with_no_collectives_in_two_rank_world_is_not_a_divergence():
    ranks = [rank(0, RankState.DIED, [], error="was killed by SIGKILL"), rank(1, RankState.BLOCKED, seq_of([0]))]
    assert first_divergence(ranks) is None


def test_crashed_rank_does_not_hide_a_real_divergence_among_the_others():
    ranks = [rank(0, RankState.RAISED, seq_of([0]), error=GLOO_CLOSED)]
    ranks += [rank(r, RankState.BLOCKED, seq_of([0, 1, 2])) for r in (1, 2)]
    ranks.append(rank(3, RankState.BLOCKED, seq_of([0, 2])))
    d = first_divergence(ranks)
    assert d is not None and d.index == 2 and d.odd_ranks == (3,)
    assert all(0 not in g.ranks for g in d.groups)


# -- mark_collateral ------------------------------------------------------------------------


def test_mark_collateral_flags_only_raised_ranks_with_collateral_errors():
    ranks = [
        rank(0, RankState.RAISED, error=KEY_ERROR),
        rank(1, RankState.RAISED, error=GLOO_CLOSED),
        rank(2, RankState.RAISED, error=GLOO_TIMEOUT),
        rank(3, RankState.DIED, error="was killed by SIGKILL"),
        rank(4, RankState.FINISHED),
        rank(5, RankState.BLOCKED),
        rank(6, RankState.RAISED, error=DDP_REDUCTION, collateral=True),  # stale flag is reset
    ]
    mark_collateral(ranks)
    assert [r.collateral for r in ranks] == [False, True, True, False, False, False, False]


# -- root_cause ----------------------------------------------------------------------------


def test_earliest_non_collateral_failure_wins_over_earlier_collateral_ones():
    ranks = [
        rank(0, RankState.RAISED, error=GLOO_CLOSED, failed_at=1.0),
        rank(1, RankState.RAISED, error=KEY_ERROR, failed_at=2.5, site="criterion.py:42 in loss", last_step=3),
        rank(2, RankState.RAISED, error=GLOO_RESET, failed_at=1.2),
        rank(3, RankState.RAISED, error=DDP_REDUCTION, failed_at=4.0),
    ]
    mark_collateral(ranks)
    root, text = root_cause(ranks, None, "ended")
    assert root == 1
    assert text == "rank 1 raised KeyError: 'segment_mask' at criterion.py:42 in loss at step 3"


def test_non_collateral_failures_are_ordered_by_failed_at_not_rank():
    ranks = [
        rank(0, RankState.RAISED, error=DDP_REDUCTION, failed_at=3.0),
        rank(1, RankState.RAISED, error=KEY_ERROR, failed_at=None),  # unknown time sorts last
        rank(2, RankState.RAISED, error="RuntimeError: injected crash", failed_at=0.5),
    ]
    mark_collateral(ranks)
    assert root_cause(ranks, None, "ended")[0] == 2
    ranks[2].failed_at = 9.0
    assert root_cause(ranks, None, "ended")[0] == 0


def test_failure_beats_divergence():
    ranks = [rank(0, RankState.RAISED, seq_of([0]), error=KEY_ERROR, failed_at=1.0)]
    ranks += [rank(r, RankState.BLOCKED, seq_of([0, 1] if r < 3 else [0, 2])) for r in (1, 2, 3)]
    mark_collateral(ranks)
    d = first_divergence(ranks)
    assert d is not None and d.odd_ranks == (3,)
    root, text = root_cause(ranks, d, "stall")
    assert root == 0 and "KeyError: 'segment_mask'" in text


def test_died_rank_is_a_root_cause():
    ranks = [
        rank(0, RankState.RAISED, error=GLOO_CLOSED, failed_at=1.5),
        rank(1, RankState.RAISED, error=GLOO_CLOSED, failed_at=1.4),
        rank(2, RankState.DIED, error="was killed by SIGKILL", failed_at=1.1, exitcode=-9),
    ]
    mark_collateral(ranks)
    root, text = root_cause(ranks, None, "ended")
    assert root == 2
    assert text == "rank 2 was killed by SIGKILL"


def test_a_fault_that_fired_before_a_peers_death_was_seen_is_the_root_cause():
    """link[dropped_bucket] once in 50 soak rounds: rank 1's links were dropped (its fault) while rank 0 waited in the
    bucket all_reduce; rank 0 died of SIGSEGV inside gloo. Dated by its last event, rank 0's death seemed first; a
    death seen only after a peer's fault fired may be that fault's doing, so the fault's rank is named. A rank
    seen dead before any fault fired keeps its place."""
    entered = {"k": "enter", "t": 0.98}

    def world(exited_at):
        return [
            rank(
                0,
                RankState.DIED,
                error="was killed by SIGSEGV",
                failed_at=0.98,
                exitcode=-11,
                events=[entered, {"k": "exited", "t": exited_at}],
            ),
            rank(
                1,
                RankState.RAISED,
                error="LinkDropped: rank 1's links dropped",
                failed_at=1.05,
                events=[entered, {"k": "fault", "t": 1.0}, {"k": "failed", "t": 1.05}],
            ),
            rank(2, RankState.RAISED, error=GLOO_CLOSED, failed_at=1.1),
        ]

    ranks = world(exited_at=1.2)
    mark_collateral(ranks)
    assert root_cause(ranks, None, "ended")[0] == 1
    ranks = world(exited_at=0.99)  # seen dead before the fault fired: not the fault's doing
    mark_collateral(ranks)
    assert root_cause(ranks, None, "ended") == (0, "rank 0 was killed by SIGSEGV")


def test_died_rank_without_error_text_says_died():
    ranks = [rank(0, RankState.BLOCKED), rank(1, RankState.DIED, failed_at=0.2)]
    assert root_cause(ranks, None, "stall") == (1, "rank 1 died")


def test_no_failure_and_a_divergence_names_the_odd_rank():
    ranks = [rank(r, RankState.BLOCKED, seq_of([0, 1, 2])) for r in range(3)]
    ranks.append(rank(3, RankState.BLOCKED, seq_of([0, 2])))
    d = first_divergence(ranks)
    root, text = root_cause(ranks, d, "stall")
    assert root == 3
    assert text.startswith("rank 3 called all_reduce([4]) at train.py:31 in train_step (step 2) as collective #2, ")
    assert text.endswith("where ranks 0-2 called all_reduce([4]) at train.py:31 in train_step (step 1)")


def test_a_rank_that_finished_without_a_collective_is_blamed_for_never_calling_it():
    ranks = [rank(r, RankState.BLOCKED, seq_of([0, 1])) for r in range(3)]
    ranks.append(rank(3, RankState.FINISHED, seq_of([0])))
    root, text = root_cause(ranks, first_divergence(ranks), "stall")
    assert root == 3
    assert text.startswith("rank 3 never called collective #2, all_reduce([4]) at train.py:31")
    assert text.endswith("(finished); ranks 0-2 called it")


def test_all_failures_collateral_names_the_earliest_as_a_hang_symptom():
    ranks = [
        rank(0, RankState.RAISED, error=GLOO_TIMEOUT, failed_at=5.2),
        rank(1, RankState.RAISED, error=GLOO_PAIR_TIMEOUT, failed_at=5.0),
        rank(2, RankState.RAISED, error=GLOO_CLOSED, failed_at=5.3),
    ]
    mark_collateral(ranks)
    assert all(r.collateral for r in ranks)
    root, text = root_cause(ranks, None, "ended")
    assert root == 1
    assert "Application timeout caused pair closure" in text
    assert "hang symptom" in text


def test_timeout_with_a_running_rank_names_it():
    ranks = [
        rank(0, RankState.BLOCKED, seq_of([0]), where="in all_reduce([4]) at train.py:31 in train_step (step 0)"),
        rank(1, RankState.RUNNING, seq_of([0]), where="train.py:12 in slow_step"),
        rank(2, RankState.BLOCKED, seq_of([0])),
    ]
    root, text = root_cause(ranks, None, "timeout")
    assert root == 1
    assert "rank 1" in text and "train.py:12 in slow_step" in text


def test_start_up_limit_names_the_ranks_that_never_joined():
    ranks = [rank(r, RankState.BLOCKED, where="in init_process_group([])") for r in (0, 2)]
    ranks.insert(1, rank(1, RankState.RUNNING, where="train.py:7 in load_dataset"))
    ranks.append(rank(3, RankState.RUNNING, where="starting (no event yet)"))
    root, text = root_cause(ranks, None, "startup")
    assert root == 1
    assert text == (
        "ranks 1, 3 never joined the process group during start-up (rank 1 at train.py:7 in load_dataset) "
        "while ranks 0, 2 waited in init_process_group"
    )


def test_blocked_ranks_without_divergence_have_no_root_rank():
    ranks = [rank(r, RankState.BLOCKED, seq_of([0])) for r in range(3)]
    root, text = root_cause(ranks, None, "stall")
    assert root is None
    assert "ranks 0-2" in text and "blocked" in text


def test_ranks_that_finished_while_the_majority_blocks_in_an_untraced_wait_are_named():
    ranks = [
        rank(r, RankState.BLOCKED, where="untraced wait: graph.py, line 979 in _engine_run_backward") for r in range(3)
    ]
    ranks.append(rank(3, RankState.FINISHED))
    root, text = root_cause(ranks, first_divergence(ranks), "stall")
    assert root == 3
    assert (
        text.startswith("ranks 0-2 blocked (untraced wait: graph.py")
        and "while rank 3 finished without joining" in text
    )


def test_completed_world_has_no_root_cause():
    ranks = [rank(r, RankState.FINISHED, seq_of([0, 1])) for r in range(2)]
    assert root_cause(ranks, first_divergence(ranks), "ended") == (None, "no failure")


# -- world_outcome --------------------------------------------------------------------------


def test_world_outcome_ended_all_finished_is_completed():
    assert world_outcome([rank(r) for r in range(3)], "ended") is Outcome.COMPLETED


@pytest.mark.parametrize("state", [RankState.RAISED, RankState.DIED])
def test_world_outcome_ended_with_a_failure_is_crashed(state):
    ranks = [rank(0), rank(1, state, error="x"), rank(2)]
    assert world_outcome(ranks, "ended") is Outcome.CRASHED


@pytest.mark.parametrize("reason", ["stall", "startup", "timeout"])
@pytest.mark.parametrize(
    "states",
    [
        (RankState.BLOCKED, RankState.BLOCKED),
        (RankState.RUNNING, RankState.BLOCKED),
        (RankState.RAISED, RankState.BLOCKED),  # a lingering failed rank + a blocked peer: the world was stopped
    ],
)
def test_world_outcome_stopped_world_is_hung(reason, states):
    ranks = [rank(i, s) for i, s in enumerate(states)]
    assert world_outcome(ranks, reason) is Outcome.HUNG


def test_timeout_running_rank_is_named_even_with_a_divergence():
    # a straggler still computing at the timeout looks "absent" from the collective its peers wait in
    ranks = [rank(0, RankState.RUNNING, seq_of([0]), where="train.py:12 in slow_step")]
    ranks += [rank(r, RankState.BLOCKED, seq_of([0, 1])) for r in (1, 2)]
    d = first_divergence(ranks)
    assert d is not None
    root, text = root_cause(ranks, d, "timeout")
    assert root == 0 and "train.py:12 in slow_step" in text


def test_gloo_mismatch_abort_blames_the_diverging_rank_not_the_aborted_receiver():
    ranks = [rank(r, RankState.BLOCKED, seq_of([0, 1])) for r in (0, 2)]
    ranks.insert(1, rank(1, RankState.BLOCKED, seq_of([0, 2])))
    ranks.append(
        rank(
            3,
            RankState.DIED,
            seq_of([0, 1]),
            failed_at=1.0,
            error="was killed by SIGABRT: op.preamble.length <= op.nbytes. size mismatch",
        )
    )
    mark_collateral(ranks)
    d = first_divergence(ranks)
    assert d is not None and d.odd_ranks == (1,)
    root, text = root_cause(ranks, d, "ended")
    assert root == 1
    assert d.describe() in text and "rank 3" in text


def test_a_completed_world_has_no_root_cause_even_when_sequences_differ():
    ranks = [rank(r, RankState.FINISHED, seq_of([0, 1, 2])) for r in range(3)]
    ranks.append(rank(3, RankState.FINISHED, seq_of([0, 2])))
    assert first_divergence(ranks) is not None
    assert root_cause(ranks, first_divergence(ranks), "ended") == (None, "no failure")


def test_ranks_raising_the_same_error_at_the_same_step_name_the_lowest_rank():
    ranks = [
        rank(
            r,
            RankState.RAISED,
            error=f"RuntimeError: Expected to have finished reduction ... for rank {r}: 7 8",
            last_step=0,
            failed_at=1.0 - r * 0.1,
        )
        for r in range(4)
    ]
    assert root_cause(ranks, None, "ended")[0] == 0


def test_ranks_raising_one_checkpoint_exception_name_the_rank_it_names_not_the_first_to_raise():
    error = "CheckpointException: CheckpointException ranks:dict_keys([2])"

    def raised(r, names):
        failed = {"k": "failed", "t": 1.0, "error": error, "step": 3, **({"names": names} if names else {})}
        return dataclasses.replace(
            rank(r, RankState.RAISED, error=error, last_step=3, failed_at=1.0 + r * 0.1), events=[failed]
        )

    ranks = [raised(r, [2]) for r in range(4)]
    culprit, text = root_cause(ranks, None, "ended")
    assert culprit == 2 and text.startswith("rank 2 raised CheckpointException"), text
    assert text.endswith("the exception ranks 0-3 raised names rank 2 as failed"), text
    unnamed = [raised(r, None) for r in range(4)]  # without the names (another exception): the lowest, as before
    assert root_cause(unnamed, None, "ended")[0] == 0


# -- faults that never fired ------------------------------------------------------------------------


def test_unfired_faults_name_the_finished_ranks_that_gave_them_their_chance():
    from ddpfaults.faults import EmptyBatch, RankCrash, SchemaDrift, Straggler
    from ddpfaults.judge.results import FiredFault, UnfiredFault
    from ddpfaults.judge.verdict import unfired_faults

    plan = [
        RankCrash(rank=1, step=1),  # fired
        Straggler(rank=1, step=3, seconds=1),  # rank 1 raised first: no chance
        EmptyBatch(rank=[1, 2], step=4),  # rank 2 finished: had its chance there
        SchemaDrift(key="k"),  # every rank: ranks 0 and 2 finished
        EmptyBatch(rank=3, step=0),  # rank 3 still blocked at the verdict: no chance
    ]
    ranks = [
        rank(0),
        rank(1, RankState.RAISED, error="RuntimeError: injected crash"),
        rank(2),
        rank(3, RankState.BLOCKED),
    ]
    fired = [FiredFault(0, repr(plan[0]), 1, 1, "on_step")]
    unfired = unfired_faults(plan, ranks, fired)
    no_loader = (  # these ranks drew no DataLoader batch (they recorded nothing at all)
        "it acts through batches drawn from a DataLoader, which the ranks it targets never used (the seams they "
        "used: none ddpfaults sees)"
    )
    assert unfired == [
        UnfiredFault(1, repr(plan[1]), ()),
        UnfiredFault(2, repr(plan[2]), (2,), no_loader),
        UnfiredFault(3, repr(plan[3]), (0, 2), no_loader),
        UnfiredFault(4, repr(plan[4]), ()),
    ]
    assert [u.had_chance for u in unfired] == [False, True, True, False]
    assert unfired[1].describe() == (
        f"{plan[2]!r} never fired, though rank 2 finished without it taking effect: {no_loader}"
    )
    assert unfired[2].describe().endswith(f"though ranks 0, 2 finished without it taking effect: {no_loader}")
    assert unfired[0].describe() == (
        f"{plan[1]!r} never fired (no rank it targets finished its function: they raised, died or stalled)"
    )
    assert unfired_faults(plan[:1], ranks, fired) == [] and unfired_faults([], ranks, []) == []
