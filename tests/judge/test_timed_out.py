"""A world the hard timeout stopped while it still made progress is timed out, not hung (ddpfaults.judge.verdict:
pure functions over hand-built rank results)."""

from __future__ import annotations

import pytest

from ddpfaults.judge.results import Busy, Collective, Divergence, DivergenceGroup, Outcome, RankResult, RankState
from ddpfaults.judge.verdict import decide, last_progress, progressing, still_running, world_outcome

# fixed throughout: deadlines and stall windows handed to the pure verdict (decide, world_outcome): no clock runs

WALL0 = 1_795_000_000.0  # the wall clock at the world's start


def step_events(steps_at: dict[int, float]) -> list[dict]:
    """A start event, then one step event per ``{step: t}``, each with both clocks."""
    events = [{"k": "start", "t": 0.1, "wall": WALL0 + 0.1}]
    return events + [{"k": "step", "step": s, "t": t, "wall": WALL0 + t} for s, t in sorted(steps_at.items())]


def live(r: int, last_step: int, last_t: float, state=RankState.RUNNING, **kw) -> RankResult:
    """A live rank whose last step event came at ``last_t``."""
    return RankResult(rank=r, state=state, last_step=last_step, events=step_events({last_step: last_t}), **kw)


SNAPSHOT = Divergence(  # what two ranks in motion look like when the dumps are taken a moment apart
    166,
    (
        DivergenceGroup((0,), Collective(166, "all_reduce", [[9]], "train.py:18 in main", 165, "DDP gradient bucket")),
        DivergenceGroup((1,), None, "was at train.py:20 in main"),
    ),
    (0,),
)


def test_a_world_still_training_at_the_timeout_timed_out_with_no_culprit_and_no_divergence():
    ranks = [live(0, 165, 4.98), live(1, 165, 4.97, RankState.BLOCKED)]
    assert world_outcome(ranks, "timeout", deadline=5.0, stall=2.0) is Outcome.TIMED_OUT
    decision = decide(ranks, SNAPSHOT, "timeout", deadline=5.0, stall=2.0)
    assert decision.outcome is Outcome.TIMED_OUT and decision.root_rank is None and decision.divergence is None
    assert decision.root_cause == (
        "still training at the deadline: step 165 on every rank, last progress 0.02 s ago — raise the timeout (5 s)"
    )


def test_ranks_at_different_steps_are_given_as_a_range_and_finished_ranks_are_named():
    ranks = [live(0, 160, 4.5), live(1, 165, 4.9), RankResult(rank=2, state=RankState.FINISHED)]
    assert still_running(ranks, 5.0) == (
        "still training at the deadline: steps 160-165 (rank 2 finished), last progress 0.10 s ago — raise the "
        "timeout (5 s)"
    )
    same = [live(0, 7, 4.5), live(1, 7, 4.9), RankResult(rank=2, state=RankState.FINISHED)]
    assert still_running(same, 5.0).startswith("still training at the deadline: step 7 on ranks 0, 1 (rank 2 ")


def test_a_world_without_steps_is_still_running():
    ranks = [RankResult(rank=r, state=RankState.RUNNING, events=[{"k": "log", "t": 9.5, "msg": "x"}]) for r in (0, 1)]
    assert (
        still_running(ranks, 10.0)
        == "still running at the deadline, last progress 0.50 s ago — raise the timeout (10 s)"
    )


def test_a_world_stuck_at_the_timeout_stays_hung_with_its_culprit():
    """Rank 1 sleeps outside any collective from 1.2 s on while rank 0 waits in one: nothing moved in the 2 s stall
    window before the 5 s deadline."""
    waiting = live(0, 3, 1.0, RankState.BLOCKED, where="in all_reduce([1]) at train.py:9 in step (step 3)")
    waiting.events.append({"k": "enter", "t": 1.1, "wall": WALL0 + 1.1, "seq": 5, "op": "all_reduce"})
    sleeping = live(1, 3, 1.2, where="train.py:14 in slow_io")
    assert last_progress([waiting, sleeping]) == 1.2
    assert world_outcome([waiting, sleeping], "timeout", deadline=5.0, stall=2.0) is Outcome.HUNG
    decision = decide([waiting, sleeping], None, "timeout", deadline=5.0, stall=2.0)
    assert decision.root_rank == 1 and "train.py:14 in slow_io" in decision.root_cause


def test_a_rank_computing_at_the_timeout_makes_a_quiet_world_timed_out_not_hung():
    """As bench_scale's 256 ranks on 2 cores: no event in the stall window before the deadline (starved ranks write
    seldom), but a rank's main thread was runnable or ran then; every rank finished while the verdict was taken.
    Judged hung before (2 runs of 4); the same world with no rank computing stays hung."""
    ranks = [live(0, 1, 290.0, busy=Busy.COMPUTING), live(1, 1, 291.0, RankState.BLOCKED)]
    assert world_outcome(ranks, "timeout", deadline=300.0, stall=2.0) is Outcome.TIMED_OUT
    decision = decide(ranks, None, "timeout", deadline=300.0, stall=2.0)
    assert decision.root_rank is None and decision.root_cause.startswith("still training at the deadline: step 1")
    quiet = [live(0, 1, 290.0), live(1, 1, 291.0, RankState.BLOCKED)]
    assert world_outcome(quiet, "timeout", deadline=300.0, stall=2.0) is Outcome.HUNG
    failed = [*ranks, RankResult(rank=2, state=RankState.RAISED, error="ValueError: x")]
    assert world_outcome(failed, "timeout", deadline=300.0, stall=2.0) is not Outcome.TIMED_OUT  # a failure decides


def test_computing_survives_the_report_document():
    rank = live(0, 1, 290.0, busy=Busy.COMPUTING)
    assert rank.to_dict()["busy"] == "computing"
    assert RankResult.from_dict(rank.to_dict()).busy is Busy.COMPUTING


@pytest.mark.parametrize("last_t, outcome", [(3.01, Outcome.TIMED_OUT), (3.0, Outcome.HUNG), (2.5, Outcome.HUNG)])
def test_the_stall_window_before_the_deadline_decides(last_t, outcome):
    ranks = [live(0, 9, last_t), live(1, 9, 1.0, RankState.BLOCKED)]
    assert world_outcome(ranks, "timeout", deadline=5.0, stall=2.0) is outcome


def test_a_failed_rank_makes_a_stopped_world_hung_however_recent_the_progress():
    raised = RankResult(rank=1, state=RankState.RAISED, error="KeyError: 'x'", events=step_events({2: 4.9}))
    ranks = [live(0, 2, 4.95, RankState.BLOCKED), raised]
    assert not progressing(ranks, 5.0, 2.0)
    assert world_outcome(ranks, "timeout", deadline=5.0, stall=2.0) is Outcome.HUNG


@pytest.mark.parametrize("reason", ["stall", "startup", "ended"])
def test_only_the_timeout_times_a_world_out(reason):
    ranks = [live(0, 9, 4.99), live(1, 9, 4.99, RankState.BLOCKED)]
    assert world_outcome(ranks, reason, deadline=5.0, stall=2.0) is not Outcome.TIMED_OUT


def test_collectives_the_flight_recorder_saw_issued_are_progress():
    """Between its steps a script rank makes DDP's gradient all_reduces, which only torch's flight recorder sees: a
    collective issued at 4.6 s is progress, though the last event came at 1.0 s."""
    bucket = Collective(9, "all_reduce", [[9]], "train.py:18 in main", 3, "DDP gradient bucket", wall=WALL0 + 4.6)
    ranks = [live(r, 3, 1.0, RankState.BLOCKED, collectives=[bucket]) for r in (0, 1)]
    assert last_progress(ranks) == pytest.approx(4.6)
    assert world_outcome(ranks, "timeout", deadline=5.0, stall=2.0) is Outcome.TIMED_OUT


def test_progress_after_the_deadline_proves_nothing_about_before_it_and_kills_are_not_progress():
    rank = live(0, 9, 2.0)
    rank.events += [{"k": "step", "step": 10, "t": 5.3, "wall": WALL0 + 5.3}, {"k": "killed", "t": 5.5}]
    assert last_progress([rank]) == 5.3
    assert last_progress([rank], until=5.0) == 2.0


def test_a_rank_of_a_timed_out_world_is_timed_out_while_live_and_keeps_it_through_json():
    running = RankResult(rank=0, state=RankState.RUNNING, timed_out=True)
    finished = RankResult(rank=1, state=RankState.FINISHED, timed_out=True)
    assert (running.outcome, finished.outcome) == (Outcome.TIMED_OUT, Outcome.COMPLETED)
    assert running.to_dict()["outcome"] == "timed out"
    assert RankResult.from_dict(running.to_dict()).outcome is Outcome.TIMED_OUT
    assert RankResult(rank=0, state=RankState.RUNNING).outcome is Outcome.HUNG


IMPORTING = (
    'File "/venv/transformers/utils/import_utils.py", line 40 in <module>\n'
    'File "<frozen importlib._bootstrap>", line 241 in _call_with_frames_removed\n'
    'File "/work/train.py", line 3 in <module>'
)


def _start_up(starting: dict[int, str | None]) -> list[RankResult]:
    """Ranks 0-2: rank 0 (and any other not in ``starting``) waits in the rendezvous; each in ``starting`` never
    joined, with the stack its dump showed (None: it did not answer)."""
    ranks = [
        RankResult(rank=r, state=RankState.BLOCKED, events=step_events({}), where="in init_process_group() at t.py:9")
        for r in range(3)
    ]
    for r, stack in starting.items():
        ranks[r] = RankResult(rank=r, state=RankState.RUNNING, events=step_events({}), stack=stack, busy=Busy.STARTING)
    return ranks


@pytest.mark.parametrize("reason", ["startup", "timeout"])
def test_a_world_still_starting_at_the_deadline_timed_out_with_no_culprit(reason):
    ranks = _start_up({1: IMPORTING, 2: None})
    decision = decide(ranks, None, reason, deadline=5.0, stall=2.0)
    assert decision.outcome is Outcome.TIMED_OUT and decision.root_rank is None
    assert decision.root_cause == (
        'still starting at the deadline: rank 1 importing at "/venv/transformers/utils/import_utils.py", line 40 in '
        "<module>; rank 2 computing (no stack: it did not get the CPU to answer); rank 0 waiting (rank 0 in "
        "init_process_group() at t.py:9)"
    )


def test_a_rank_not_started_yet_is_said_so():
    ranks = _start_up({1: None})
    ranks[1].events, ranks[1].where = [], "never started (start-up ran out of time first)"
    decision = decide(ranks, None, "startup", deadline=5.0, stall=2.0)
    assert decision.outcome is Outcome.TIMED_OUT
    assert "rank 1 never started (start-up ran out of time first)" in decision.root_cause


def test_a_rank_that_never_joined_and_was_idle_is_the_culprit_of_a_hung_start_up():
    ranks = _start_up({1: 'File "/work/train.py", line 7 in load_data'})
    ranks[1].busy = None  # the judge found it idle: no CPU, not runnable, its stack answered and not importing
    ranks[1].where = "train.py:7 in load_data"
    decision = decide(ranks, None, "startup", deadline=5.0, stall=2.0)
    assert decision.outcome is Outcome.HUNG and decision.root_rank == 1
    assert decision.root_cause.startswith("rank 1 never joined the process group during start-up")


@pytest.mark.parametrize("reason", ["stall", "deadlock"])
def test_only_a_deadline_finds_a_world_starting(reason):
    ranks = _start_up({1: IMPORTING})
    assert world_outcome(ranks, reason, deadline=5.0, stall=2.0) is Outcome.HUNG


def test_a_failure_decides_over_a_rank_still_starting():
    ranks = _start_up({1: IMPORTING})
    ranks[2] = RankResult(rank=2, state=RankState.RAISED, error="ValueError: bad config", events=step_events({}))
    decision = decide(ranks, None, "startup", deadline=5.0, stall=2.0)
    assert decision.outcome is Outcome.HUNG and decision.root_rank == 2


def test_a_rank_still_starting_keeps_it_through_json():
    rank = _start_up({1: IMPORTING})[1]
    assert rank.to_dict()["busy"] == "starting"
    assert RankResult.from_dict(rank.to_dict()).busy is Busy.STARTING
