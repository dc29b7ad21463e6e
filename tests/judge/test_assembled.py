"""A world's result is assembled once and never changed after (the runtime half; tests/test_layout.py reads the
source for the other): an assembled result refuses any change, and every result the engine hands over is one."""

import dataclasses

import pytest

from ddpfaults.engine import restarts
from ddpfaults.faults import Plan, RankCrash
from ddpfaults.judge.results import FiredFault, Outcome, RankResult, RankState, UnfiredFault, WorldResult
from ddpfaults.spec import RunSpec


def _world(outcome=Outcome.COMPLETED, **fields) -> WorldResult:
    ranks = [RankResult(rank=r, state=RankState.FINISHED) for r in range(2)]
    return WorldResult(outcome, ranks, "", None, "ended", 1.0, spec=RunSpec(world_size=2, seed=7), **fields)


def test_an_assembled_result_refuses_every_change_and_leaves_the_one_it_came_from_as_it_was():
    verdict = _world()
    assembled = verdict.assembled(replay="python -m ddpfaults run x.py:f", reused=True)
    for name, value in [("replay", "other"), ("outcome", Outcome.HUNG), ("fired", []), ("anything", 1)]:
        with pytest.raises(dataclasses.FrozenInstanceError, match=f"cannot assign to field '{name}'"):
            setattr(assembled, name, value)
    assert (assembled.replay, assembled.reused) == ("python -m ddpfaults run x.py:f", True)
    assert (verdict.replay, verdict.reused) == (None, False)  # a new result: the verdict is not touched
    assert assembled.to_dict() == {**verdict.to_dict(), "replay": assembled.replay, "reused": True}
    assert (assembled.world_size, assembled.seed, assembled.spec) == (2, 7, verdict.spec)  # the settings come along


def test_a_torchrun_result_stays_one_when_assembled():
    verdict = WorldResult(Outcome.CRASHED, [], "x", None, "ended", 1.0, world_size=2, start_method="torchrun")
    assembled = verdict.assembled(preemption=None)
    assert (assembled.launcher, assembled.start_method, assembled.to_dict()) == (
        "torchrun",
        "torchrun",
        verdict.to_dict(),
    )


def test_the_attempts_merged_and_the_resume_finding_make_assembled_results():
    plan = Plan([RankCrash(rank=1, step=1), RankCrash(rank=0, step=1, attempt=1)], 2)
    first = _world(Outcome.CRASHED, unfired=[UnfiredFault(1, repr(plan[1]))])
    first.fired = [FiredFault(0, repr(plan[0]), 1, 1, "on_step")]  # a hand-built result is not assembled yet
    last = _world(unfired=[UnfiredFault(1, repr(plan[1]), (0,))])
    merged = restarts.merge([first, last], plan)
    assert [u.index for u in merged.unfired] == [1] and merged.unfired[0].finished == (0,)  # each attempt's own
    assert [a["outcome"] for a in merged.attempts] == ["crashed", "completed"]
    assert (first.attempts, last.attempts, last.unfired[0].finished) == ([], [], (0,))  # the attempts left alone
    with pytest.raises(dataclasses.FrozenInstanceError):
        merged.unfired = []
    single = restarts.run_attempts(lambda attempt: _world(resume_records=["per rank"]), Plan((), 2), 0)
    assert single.resume_records == [["per rank"]]
    with pytest.raises(dataclasses.FrozenInstanceError):
        single.resume_records = None
    checked = restarts.checking_resume(lambda plan: single, Plan((), 2), RunSpec(check_resume=True))
    assert checked.resume["equivalent"] is None and single.resume is None  # not resumed: a new result says so
    with pytest.raises(dataclasses.FrozenInstanceError):
        checked.resume = None
