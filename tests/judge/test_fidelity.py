"""When a judged failure formed and how long the verdict took from there (ddpfaults.judge.checks.fidelity: pure
functions over hand-built results)."""

from __future__ import annotations

import pytest

from ddpfaults.judge.checks.fidelity import divergence_matches, formed_at, settled_at, verdict_latency
from ddpfaults.judge.results import Collective, Divergence, DivergenceGroup, Outcome, RankResult, RankState, WorldResult

WALL0 = 1_795_000_000.0


def world(outcome: Outcome, ranks: list[RankResult], verdict_t: float) -> WorldResult:
    events = [{"k": "verdict", "t": verdict_t, "reason": "stall"}]
    return WorldResult(outcome, ranks, "", None, "", verdict_t + 0.01, len(ranks), 0, events=events)


def ev(k: str, t: float, **fields) -> dict:
    return {"k": k, "t": t, "wall": WALL0 + t, **fields}


def blocked_in_all_reduce(r: int, entered: float) -> RankResult:
    """A rank that left collective 2 and has been waiting in collective 3 since ``entered``."""
    events = [ev("start", 0.1), ev("enter", 0.5, seq=2), ev("exit", 0.6, seq=2), ev("enter", entered, seq=3)]
    return RankResult(rank=r, state=RankState.BLOCKED, events=events + [{"k": "killed", "t": 9.0}])


def test_a_crash_formed_at_the_first_failure_that_is_not_collateral():
    ranks = [
        RankResult(rank=0, state=RankState.RAISED, error="Connection closed by peer", collateral=True, failed_at=0.9),
        RankResult(rank=1, state=RankState.RAISED, error="KeyError: 'x'", failed_at=1.0),
        RankResult(rank=2, state=RankState.DIED, error="was killed by SIGKILL", failed_at=1.1),
    ]
    crashed = world(Outcome.CRASHED, ranks, 2.5)
    assert formed_at(crashed) == 1.0 and verdict_latency(crashed) == pytest.approx(1.5)
    for r in ranks:
        r.collateral = True
    assert formed_at(crashed) == 0.9  # a hang symptom only: the first failure of all


@pytest.mark.parametrize("verdict_t, latency", [(3.043, 2.04), (1.053, 0.05)], ids=["stall-window", "proved"])
def test_a_hang_formed_when_the_last_rank_took_its_final_place_whenever_the_judge_saw_it(verdict_t, latency):
    """SkippedCollective(rank=2, step=3) in a 4-rank loop: rank 2 finishes at 1.002 s, the others enter collective
    #4 by 1.003 s. The latency is the verdict's distance from that, after a 2 s stall window or at once."""
    ranks = [blocked_in_all_reduce(r, entered) for r, entered in ((0, 1.000), (1, 1.001), (3, 1.003))]
    ranks.insert(2, RankResult(rank=2, state=RankState.FINISHED, events=[ev("finished", 1.002), ev("exited", 1.2)]))
    hung = world(Outcome.HUNG, ranks, verdict_t)
    assert formed_at(hung) == 1.003
    assert verdict_latency(hung) == pytest.approx(latency)


def test_a_rank_blocked_in_a_collective_only_the_flight_recorder_saw_settled_when_it_issued_it():
    """Plain DDP: the gradient bucket's all_reduce has no enter event; the record has it, issued at 2.25 s."""
    bucket = Collective(7, "all_reduce", [[9]], "train.py:18 in main", 3, "DDP gradient bucket", wall=WALL0 + 2.25)
    done = Collective(6, "all_reduce", [[9]], "train.py:18 in main", 2, "DDP gradient bucket", True, WALL0 + 1.5)
    rank = RankResult(rank=0, state=RankState.BLOCKED, events=[ev("start", 0.1), ev("step", 2.2, step=3)])
    rank.collectives = [done, bucket]
    assert settled_at(rank, until=5.0) == pytest.approx(2.25)


def test_a_rank_idle_outside_collectives_settled_at_its_last_event_and_a_failed_one_when_it_failed():
    idle = RankResult(rank=1, state=RankState.RUNNING, events=[ev("start", 0.1), ev("step", 1.4, step=2)])
    assert settled_at(idle, until=5.0) == 1.4
    lingering = RankResult(rank=0, state=RankState.RAISED, failed_at=0.7, events=[ev("failed", 0.7)])
    assert settled_at(lingering, until=5.0) == 0.7
    died = RankResult(rank=2, state=RankState.DIED, failed_at=0.8, events=[ev("step", 0.8, step=1)])
    assert settled_at(died, until=5.0) == 0.8


def test_what_happened_after_the_verdict_is_not_when_the_hang_formed():
    rank = blocked_in_all_reduce(0, 1.0)
    rank.events.append({"k": "exited", "t": 9.1, "code": -9})
    assert settled_at(rank, until=3.0) == 1.0


@pytest.mark.parametrize("outcome", [Outcome.COMPLETED, Outcome.TIMED_OUT])
def test_nothing_formed_in_a_world_that_completed_or_timed_out(outcome):
    done = world(outcome, [RankResult(rank=0, state=RankState.FINISHED, events=[ev("finished", 1.0)])], 1.1)
    assert formed_at(done) is None and verdict_latency(done) is None


def test_a_divergence_matches_the_expected_rank_and_collective():
    call = Collective(8, "all_reduce", [[178]], "train.py:105 in step", 2, "DDP gradient bucket")
    divergence = Divergence(8, (DivergenceGroup((0, 2, 3), call), DivergenceGroup((1,), None, "finished")), (1,))
    assert divergence_matches(divergence, 1, "all_reduce") and divergence_matches(divergence, None, "all_reduce")
    assert not divergence_matches(divergence, 0, "all_reduce") and not divergence_matches(divergence, 1, "barrier")
    assert not divergence_matches(None, 1, None)
