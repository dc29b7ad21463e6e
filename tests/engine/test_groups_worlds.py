"""Process groups beyond the default one in real worlds: each group's collectives are compared among its members
only, so a completed world with subgroups or a 2-D mesh shows no divergence, and a rank that skips a collective of
its tp group is named in that group."""

import os

import pytest

from ddpfaults import Outcome, run_script, run_world
from ddpfaults.faults import RankKilled
from groupfns import (
    crossed_waits,
    group_pipeline,
    groups_in_order,
    mesh_2d,
    pipeline,
    pipeline_chunks,
    subgroups,
    torch_pipeline,
    two_groups,
)
from pairwise import pairwise
from processes import WORLD_GUARD


def test_a_completed_2d_mesh_shows_no_divergence():
    """Two tp pairs and two dp pairs each run their own sequence (judged as 'process group 3 vs 4' before)."""
    result = run_world(mesh_2d, world_size=4, timeout=WORLD_GUARD)
    assert result.outcome == Outcome.COMPLETED, result.report()
    assert result.divergence is None, result.report()
    assert "divergent" not in result.report()
    calls = result.ranks[3].collectives
    assert result.ranks[3].recorder == "flight recorder"
    assert {c.group for c in calls} == {"1,3", "2,3"}, [c.group for c in calls]
    assert "process group mesh_tp of ranks 2, 3" in calls[0].note


@pytest.mark.parametrize("recorder", ["flight recorder", "tracing"])
@pytest.mark.parametrize("world_size", [2, 4])
def test_completed_subgroups_of_different_shapes_show_no_divergence(world_size, recorder, monkeypatch):
    """The halves all_reduce tensors of different sizes, and two groups have the same members (the whole world):
    torch's record and ddpfaults' tracing (the recorder off) know each group by the same identity."""
    if recorder == "tracing":
        monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "0")
    result = run_world(subgroups, world_size=world_size, timeout=WORLD_GUARD, reuse=False)
    assert result.outcome == Outcome.COMPLETED, result.report()
    assert result.divergence is None, result.report()
    assert result.ranks[0].recorder == recorder
    keys = {c.group for c in result.ranks[0].collectives}
    whole = ",".join(str(r) for r in range(world_size))
    assert {whole, f"{whole}#1", None} <= keys, keys


def test_a_rank_skipping_its_tp_all_reduce_is_named_in_its_tp_group():
    # fixed: the stall window of the hang this test expects; load calls none sooner (a starved rank is computing)
    result = run_world(mesh_2d, world_size=4, kwargs={"skip_rank": 3, "skip_step": 1}, stall=1.0, timeout=WORLD_GUARD)
    assert result.outcome == Outcome.HUNG, result.report()
    assert result.root_rank == 3, result.report()
    assert "in step 1 rank 3 made all_reduce([4]) [process group mesh_dp of ranks 1, 3]" in result.root_cause
    groups = {g.call.group for g in result.divergence.groups if g.call is not None}
    assert groups == {"2,3"}, result.report()  # the tp pair of ranks 2 and 3 alone is compared
    assert "in a process group made by new_group or init_device_mesh" in result.reason, result.reason


def test_a_rank_making_its_groups_in_another_order_is_named():
    """Measured: every rank waits in new_group (gloo connects a group's members through the store, under another
    group's name on the swapped rank); before, nothing was judged until the timeout ('untraced wait')."""
    # fixed: the stall window of the hang this test expects; load calls none sooner (a starved rank is computing)
    result = run_world(groups_in_order, world_size=4, kwargs={"swap_rank": 2}, stall=1.0, timeout=WORLD_GUARD)
    assert result.outcome == Outcome.HUNG, result.report()
    assert result.root_rank == 2, result.report()
    assert "rank 2 created tp before dp" in result.root_cause, result.report()
    assert all(r.where.startswith("in new_group() [") for r in result.ranks), result.report()
    assert result.elapsed < 60, result.report()  # the stall rule, not the timeout
    assert "ranks 0-3 wait in a process group made by new_group" in result.reason, result.reason
    assert "gloo's 30-minute default" in result.reason


SCRIPTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support", "scripts")
TWO_GROUPS = os.path.join(SCRIPTS, "two_groups.py")


def _two_groups(form, world_size, how):
    """The world of ``scripts/two_groups.py`` (or its function form) with rank 1 making its groups ``how``."""
    option = {"swap": "swap_rank", "extra": "extra_rank"}[how]
    if form == "script":
        argv = [f"--{option.replace('_', '-')}", "1"]
        # fixed: the stall window of the hang (ranks waiting in new_group, which no proof reads); load calls none sooner
        return run_script(TWO_GROUPS, argv, world_size=world_size, stall=1.0, timeout=WORLD_GUARD)
    # fixed: the stall window of the hang (ranks waiting in new_group, which no proof reads); load calls none sooner
    return run_world(two_groups, world_size=world_size, kwargs={option: 1}, stall=1.0, timeout=WORLD_GUARD)


@pytest.mark.parametrize(("how", "world_size", "form"), pairwise(["swap", "extra"], [2, 4], ["function", "script"]))
def test_groups_made_in_another_order_by_one_rank_are_named_by_the_majority_and_symmetric_at_two(how, form, world_size):
    """Rank 1 makes the world's groups b before a (``swap``: they connect crosswise, as torch names groups by a
    per-process counter, and each rank waits in an all_reduce its peers make in the other group), or makes a group
    of its own first (``extra``: every rank waits in new_group). At 4 ranks the three that agree name rank 1, by the
    order it made its groups in, whatever the collectives then did; at 2 ranks, one order against the other, no
    rank is named and the root cause says why (each side's order is as much a departure as the other's)."""
    result = _two_groups(form, world_size, how)
    assert result.outcome == Outcome.HUNG, result.report()
    made = "process group b of ranks" if how == "swap" else "process group extra of ranks 1"
    if world_size == 4:
        assert result.root_rank == 1, result.report()
        assert f"rank 1 made {made}" in result.root_cause and "as its process group #1" in result.root_cause
        if how == "swap":
            assert "rank 1 created b before a" in result.root_cause, result.report()
    else:
        assert result.root_rank is None, result.report()
        assert "nothing shows which" in result.root_cause, result.report()
        assert f"rank 0 made process group a of ranks 0, 1; rank 1 made {made}" in result.root_cause
        assert "so nothing shows which order was meant" in result.root_cause, result.report()
        if how == "extra":
            assert "extra of ranks 1, which no other rank made" in result.root_cause, result.report()


def test_groups_made_in_the_same_order_complete():
    result = run_world(groups_in_order, world_size=4, timeout=WORLD_GUARD)
    assert result.outcome == Outcome.COMPLETED, result.report()
    assert result.divergence is None, result.report()


@pytest.mark.parametrize("world_size, short", [(2, 0), (4, 1)])
def test_a_stage_sending_one_microbatch_fewer_is_a_proved_deadlock_naming_it(world_size, short):
    """gloo's send waits for its recv: the next stage waits for ever in a recv never sent (and the stage after it
    in its own recv); proved from the ranks' sends and receives, well before the stall window."""
    # fixed: a stall far past the proof: the deadlock proof must decide, and proves within about a second
    result = run_world(pipeline, world_size=world_size, kwargs={"short_stage": short}, stall=30.0, timeout=WORLD_GUARD)
    assert result.outcome == Outcome.HUNG, result.report()
    assert result.reason.startswith("deadlock proved"), result.report()
    assert f"rank {short + 1} waits in its recv #6 from rank {short}, which rank {short} never sends" in result.reason
    assert result.root_rank == short, result.report()
    assert f"rank {short} sent 2 message(s) to rank {short + 1} in step 1" in result.root_cause, result.report()
    assert result.ranks[short + 1].where.startswith(f"in recv([8]) [from rank {short}]"), result.report()


@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("form", ["function", "script"])
def test_a_stage_whose_batch_holds_one_microbatch_fewer_is_named_by_its_own_earlier_steps(form, world_size):
    """GPipe by hand over blocking send/recv: stage 0 cuts each step's batch with ``chunk(4)``, and at step 2 its
    batch of 6 rows gives 3 microbatches. It sends one activation fewer and waits for its first gradient while stage
    1 waits for the fourth activation (and each later stage for its own): a proved deadlock in which every stage is
    short on one pair, so the pair counts name no one; stage 0's own earlier steps (4 sends, then 4 receives) do."""
    if form == "script":
        path = os.path.join(SCRIPTS, "pipeline_chunks.py")
        # fixed: a stall far past the proof: the deadlock proof must decide, and proves within about a second
        result = run_script(path, ["--short-step", "2"], world_size=world_size, stall=30.0, timeout=WORLD_GUARD)
    else:
        kwargs = {"short_step": 2}
        # fixed: a stall far past the proof: the deadlock proof must decide, and proves within about a second
        result = run_world(pipeline_chunks, world_size=world_size, kwargs=kwargs, stall=30.0, timeout=WORLD_GUARD)
    assert result.outcome == Outcome.HUNG, result.report()
    assert result.reason.startswith("deadlock proved"), result.report()
    assert result.root_rank == 0, result.report()
    assert (
        "in step 2 rank 0 made 3 send(s) to rank 1, then 1 recv(s) from rank 1 so far, where its other steps made 4 "
        "send(s) to rank 1, then 4 recv(s) from rank 1" in result.root_cause
    ), result.report()
    complete = run_world(pipeline_chunks, world_size=world_size, timeout=WORLD_GUARD)
    assert complete.outcome == Outcome.COMPLETED and complete.divergence is None, complete.report()


def test_two_ranks_sending_to_each_other_first_are_a_proved_deadlock_naming_no_one():
    # fixed: a stall far past the proof: the deadlock proof must decide, and proves within about a second
    result = run_world(pipeline, world_size=2, kwargs={"both_send_first": True}, stall=30.0, timeout=WORLD_GUARD)
    assert result.outcome == Outcome.HUNG, result.report()
    assert "rank 0 waits in its send #1 to rank 1, which rank 1 never receives" in result.reason, result.report()
    assert result.root_rank is None, result.report()
    assert "rank 0 blocked (in send([8]) [to rank 1]" in result.root_cause
    assert "rank 1 blocked (in send([8]) [to rank 0]" in result.root_cause


def test_ranks_waiting_across_groups_for_each_other_are_a_proved_deadlock():
    """One wait-for graph across groups: rank 0 waits in its tp all_reduce for rank 1, which waits in its dp
    barrier for rank 3, which waits in tp for rank 2, which waits in dp for rank 0; proved from the groups' counts
    (confirmed by the flight records) well before the stall window."""
    # fixed: a stall far past the proof: the deadlock proof must decide, and proves within about a second
    result = run_world(crossed_waits, world_size=4, stall=30.0, timeout=WORLD_GUARD)
    assert result.outcome == Outcome.HUNG, result.report()
    assert result.reason.startswith("deadlock proved"), result.report()
    assert (
        "rank 0 waits in collective #2 (all_reduce) of process group tp of ranks 0, 1, which rank 1 never makes (it "
        "is stuck in collective #2 (barrier) of process group dp of ranks 1, 3)"
    ) in result.reason, result.reason
    assert (
        "rank 2 waits in collective #2 (barrier) of process group dp of ranks 0, 2, which rank 0 never makes (it is "
        "stuck in collective #2 (all_reduce) of process group tp of ranks 0, 1)"
    ) in result.reason, result.reason


@pytest.mark.parametrize("late_rank", [None, 1])
def test_groups_used_in_the_same_order_complete(late_rank):
    """No false proof: with rank 1 asleep before its step-1 collectives, ranks 0 and 3 wait in tp and rank 2 in dp
    (behind rank 0) for it; it may still act, so nothing is proved, and it comes (the stall window is longer)."""
    kwargs = {"crossed": False, "late_rank": late_rank}
    # fixed: 10 s against rank 1's 1.5 s sleep, and a sleeping rank is not waiting: its peers are never hung
    result = run_world(crossed_waits, world_size=4, kwargs=kwargs, stall=10.0, timeout=WORLD_GUARD)
    assert result.outcome == Outcome.COMPLETED, result.report()
    assert result.divergence is None, result.report()


def test_a_receive_waiting_on_a_rank_in_a_collective_is_a_proved_deadlock():
    """A send or receive and a collective in one graph: rank 0 receives before the world's barrier, rank 1 sends
    only after it."""
    # fixed: a stall far past the proof: the deadlock proof must decide, and proves within about a second
    result = run_world(crossed_waits, world_size=2, kwargs={"mixed": True}, stall=30.0, timeout=WORLD_GUARD)
    assert result.outcome == Outcome.HUNG, result.report()
    assert result.reason.startswith("deadlock proved"), result.report()
    assert "rank 0 waits in its recv #1 from rank 1, which rank 1 never sends (it is stuck in collective" in (
        result.reason
    ), result.reason
    assert "(barrier), which rank 0 never makes (it is stuck in its recv #1 from rank 1)" in result.reason


def test_sends_and_receives_addressed_by_group_rank_are_matched_by_global_rank():
    """``send(group_dst=1, group=g)`` in the group of ranks 2 and 3 goes to global rank 3: the tracing records the
    peer's global rank, so the pair (2, 3) is matched, the deadlock proved and rank 2 named (not ranks 0 and 1)."""
    # fixed: a stall far past the proof: the deadlock proof must decide, and proves within about a second
    result = run_world(group_pipeline, world_size=4, kwargs={"short": True}, stall=30.0, timeout=WORLD_GUARD)
    assert result.outcome == Outcome.HUNG, result.report()
    assert result.reason.startswith("deadlock proved"), result.report()
    assert "rank 3 waits in its recv #3 from rank 2, which rank 2 never sends (it finished after 2 send(s)" in (
        result.reason
    ), result.reason
    assert result.root_rank == 2, result.report()
    assert "rank 2 sent 2 message(s) to rank 3" in result.root_cause, result.report()
    assert result.ranks[3].where.startswith("in recv([8]) [from rank 2; process group of ranks 2, 3]"), result.report()
    complete = run_world(group_pipeline, world_size=4, timeout=WORLD_GUARD)
    assert complete.outcome == Outcome.COMPLETED and complete.divergence is None, complete.report()


@pytest.mark.slow
def test_torch_pipelining_runs_on_gloo_and_a_killed_stage_is_named():
    """torch.distributed.pipelining (PipelineStage + ScheduleGPipe, 2 stages) runs on gloo CPU: completed with no
    divergence (its isend/irecv matched pair by pair); a stage killed at step 1 is the crash's root cause and its
    peer's error collateral; a stage fed one microbatch fewer is named by its own earlier steps. Slow: each rank
    imports torch.distributed.pipelining (5-25 s of a loaded machine)."""
    complete = run_world(torch_pipeline, world_size=2, timeout=WORLD_GUARD)
    assert complete.outcome == Outcome.COMPLETED, complete.report()
    assert complete.divergence is None, complete.report()
    assert any(c.op == "isend" for c in complete.ranks[0].collectives), complete.report()
    killed = run_world(torch_pipeline, world_size=2, faults=[RankKilled(rank=1, step=1)], timeout=WORLD_GUARD)
    assert killed.outcome == Outcome.CRASHED, killed.report()
    assert killed.root_rank == 1, killed.report()
    assert "rank 1 was killed by SIGKILL" in killed.root_cause, killed.report()
    assert killed.ranks[0].collateral, killed.report()
    # stage 0 feeds the schedule of 3 at step 3: its own steps 1 and 2 (step 0 ran both schedules) name it
    kwargs = {"short_step": 3, "steps": 5}
    # fixed: the stall window of the hang (pipelining waits outside the traced calls: no proof); load calls none sooner
    short = run_world(torch_pipeline, world_size=2, kwargs=kwargs, stall=2.0, timeout=WORLD_GUARD)
    assert short.outcome == Outcome.HUNG and short.root_rank == 0, short.report()
    assert "in step 3 rank 0 made 3 send(s) to rank 1, then 1 recv(s) from rank 1 so far" in short.root_cause
