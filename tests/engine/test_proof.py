"""Deadlocks proved from the record, in real worlds (real gloo ranks): judged as soon as they form, not a stall window
later; and a rank that fails while its peers still join the process group is a crash, whoever was still joining.

Latencies are measured from the ranks' own events (the last rank's blocking, finishing or joining event) to the
verdict, with a stall window far longer than any of them: a verdict inside it can only come from the proof.
"""

import os

import pytest

import rankfns
from ddpfaults import Outcome, RankState, run_script, run_world
from ddpfaults.engine import census
from ddpfaults.faults import SkippedCollective, SlowLink
from ddpfaults.judge.live.rendezvous import ABANDON_QUIET

SCRIPTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support", "scripts")
# fixed: a stall far past the proof: the deadlock proof must decide, and proves within about a second
STALL, TIMEOUT = 10.0, 40.0  # nothing here may wait for the stall rule
PROMPT = 1.0  # seconds from the deadlock forming to the verdict, at most (bench/bench_proof.py measures it)


def _event(result, kind):
    return next(e for e in result.events if e["k"] == kind)


def _latency(result) -> float:
    """Seconds from the deadlock forming (the proof's own dating: the last rank's stand) to the verdict."""
    return _event(result, "verdict")["t"] - _event(result, "deadlock")["t"]


def _last_event(rank, kind, **match) -> float:
    return [e["t"] for e in rank.events if e["k"] == kind and all(e.get(k) == v for k, v in match.items())][-1]


def _no_survivors(result):
    assert census.survivors([r.pid for r in result.ranks if r.pid]) == []


@pytest.mark.parametrize("world_size, skipper", [(4, 2), (2, 1)])
def test_a_rank_that_finished_one_collective_short_is_a_deadlock_proved_at_once(world_size, skipper):
    faults = [SkippedCollective(rank=skipper, step=3)]
    result = run_world(rankfns.all_reduce_steps, world_size=world_size, stall=STALL, timeout=TIMEOUT, faults=faults)
    assert result.outcome == Outcome.HUNG, result.report()
    waiting = [r for r in range(world_size) if r != skipper]
    assert result.reason == (
        "deadlock proved: every live rank waits in a collective, send or receive that a peer can never make: "
        f"rank {skipper} finished; {'ranks 0, 1, 3 wait' if world_size == 4 else 'rank 0 waits'} in collective #4 "
        f"(all_reduce), which rank {skipper} never makes (it finished after its collective #3)"
    )
    deadlock = _event(result, "deadlock")
    assert deadlock["ranks"] == waiting
    # it formed when the last rank took its stand: the finished rank's end, or the others' entering #4
    stands = [_last_event(result.ranks[skipper], "finished")]
    stands += [_last_event(result.ranks[r], "enter", op="all_reduce") for r in waiting]
    assert deadlock["t"] == pytest.approx(max(stands), abs=1e-5)
    assert 0 <= _latency(result) < PROMPT, result.events
    assert result.ranks[skipper].state == RankState.FINISHED
    for r in waiting:
        rank = result.ranks[r]
        assert rank.state == RankState.BLOCKED and rank.where.startswith("in all_reduce([1]) at rankfns.py")
        assert "in all_reduce" in rank.stack  # the survivors' stacks were taken for the report
    if world_size == 4:
        assert result.root_rank == skipper


@pytest.mark.parametrize("world_size, skipper", [(4, 2), (2, 1)])
def test_a_script_whose_rank_skipped_an_all_reduce_is_a_deadlock_proved_at_the_closing_barrier(world_size, skipper):
    """A plain torchrun-style script: the rank that skipped step 3's all_reduce reaches the closing barrier as its
    collective #6 while its peers make their sixth all_reduce: gloo never matches the two, whatever comes next."""
    script = os.path.join(SCRIPTS, "all_reduce_loop.py")
    faults = [SkippedCollective(rank=skipper, step=3)]
    result = run_script(script, ["--steps", "6"], world_size=world_size, stall=STALL, timeout=TIMEOUT, faults=faults)
    assert result.outcome == Outcome.HUNG, result.report()
    assert result.reason.startswith("deadlock proved"), result.reason
    assert f"in collective #6 (all_reduce), which rank {skipper} never makes (its collective #6 is barrier)" in (
        result.reason
    )
    assert 0 <= _latency(result) < PROMPT, result.events
    assert result.ranks[skipper].where.startswith("in barrier() at all_reduce_loop.py")
    for r in range(world_size):
        assert result.ranks[r].state == RankState.BLOCKED
    _no_survivors(result)


def test_ranks_waiting_in_a_collective_for_a_late_peer_are_not_a_deadlock():
    """Rank 1 sleeps half a second before its step-2 all_reduce while the others wait in theirs: slow, never
    proved stuck (nothing says rank 1 cannot come)."""
    result = run_world(
        rankfns.all_reduce_steps_rank1_late, world_size=4, kwargs={"seconds": 0.5}, stall=STALL, timeout=TIMEOUT
    )
    assert result.outcome == Outcome.COMPLETED, result.report()
    assert [r.value for r in result.ranks] == [256.0] * 4


@pytest.mark.parametrize("wrap", ["plain", "ctx"])
def test_ddp_ranks_waiting_for_a_late_peers_gradient_bucket_are_not_a_deadlock(wrap):
    """Rank 1 sleeps before its step-2 backward: its peers wait in DDP's finalize for a bucket it has yet to make
    (ctx.ddp announces that wait; plain DDP's is read from the record and the stacks). Slow, never proved stuck."""
    kwargs = {"wrap": wrap, "late_rank": 1, "late_seconds": 0.5}
    result = run_world(rankfns.ddp_steps, world_size=4, kwargs=kwargs, stall=STALL, timeout=TIMEOUT)
    assert result.outcome == Outcome.COMPLETED, result.report()
    assert [e["k"] for e in result.events] == ["verdict"]


def test_a_link_held_back_in_a_collective_is_not_a_deadlock():
    faults = [SlowLink(rank=2, step=1, delay=0.5)]
    result = run_world(rankfns.all_reduce_steps, world_size=4, stall=STALL, timeout=TIMEOUT, faults=faults)
    assert result.outcome == Outcome.COMPLETED, result.report()


def _joined_late(result, late) -> float:
    """When the late rank entered init_process_group (the last rank to: the rendezvous was then complete or never)."""
    return _last_event(result.ranks[late], "enter", op="init_process_group")


@pytest.mark.parametrize("world_size, fail, late", [(4, 1, 2), (2, 1, 0)])
def test_a_script_rank_that_raises_while_a_peer_still_joins_is_a_crash_on_that_rank(world_size, fail, late):
    script = os.path.join(SCRIPTS, "join_late.py")
    argv = ["--fail", str(fail), "--late", str(late), "--delay", "1.0"]
    result = run_script(script, argv, world_size=world_size, stall=STALL, timeout=TIMEOUT)
    assert result.outcome == Outcome.CRASHED, result.report()
    assert result.root_rank == fail and "found no data" in result.root_cause
    assert result.reason.startswith("a rank failed while the others still waited to join the process group")
    assert result.ranks[fail].state == RankState.RAISED
    for r in range(world_size):
        if r != fail:
            assert result.ranks[r].state == RankState.BLOCKED and "init_process_group" in result.ranks[r].where
    # judged once the late rank was waiting to join too, not a stall window later
    assert 0 <= _event(result, "verdict")["t"] - _joined_late(result, late) < PROMPT + ABANDON_QUIET, result.events
    _no_survivors(result)


@pytest.mark.parametrize("world_size, fail, late", [(4, 1, 2), (2, 1, 0)])
def test_a_rank_whose_job_fails_before_its_group_is_made_is_a_crash_on_that_rank(world_size, fail, late):
    """The function form: ranks make their process group before the function, so the failure and the delay come
    from unpickling the function's argument (rankfns.JoinLate), which every rank does before joining. A cold world:
    a warm one's ranks joined their group in an earlier job."""
    result = run_world(
        rankfns.all_reduce_steps,
        world_size=world_size,
        args=(rankfns.JoinLate(fail=fail, late=late, delay=1.0),),
        stall=STALL,
        timeout=TIMEOUT,
        reuse=False,
    )
    assert not result.warm
    assert result.outcome == Outcome.CRASHED, result.report()
    assert result.root_rank == fail and "found no data" in result.root_cause
    assert result.reason.startswith("a rank failed while the others still waited to join the process group")
    assert 0 <= _event(result, "verdict")["t"] - _joined_late(result, late) < PROMPT + ABANDON_QUIET, result.events


@pytest.mark.parametrize("world_size, fail, late", [(4, 1, 2), (2, 1, 0)])
def test_lingering_ranks_that_never_join_leave_their_peers_hung_and_it_is_proved(world_size, fail, late):
    """peer_failure="linger" (NCCL-like): the failed rank keeps its process, its peers wait to join it for ever."""
    script = os.path.join(SCRIPTS, "join_late.py")
    argv = ["--fail", str(fail), "--late", str(late), "--delay", "1.0"]
    result = run_script(script, argv, world_size=world_size, stall=STALL, timeout=TIMEOUT, peer_failure="linger")
    assert result.outcome == Outcome.HUNG, result.report()
    assert result.root_rank == fail
    assert "wait in the process group's rendezvous (init_process_group)" in result.reason or world_size == 2
    assert f"which rank {fail} never makes (it raised and lingers without joining the process group)" in result.reason
    assert 0 <= _latency(result) < PROMPT, result.events
    _no_survivors(result)
