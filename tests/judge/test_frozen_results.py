"""A world's result never changes once built (``WorldResult`` is frozen; tests/test_one_answer_results.py proves the
type): whoever knows more after the verdict makes a new one with ``dataclasses.replace``, leaving the one others hold
as it was."""

import dataclasses

import pytest

from ddpfaults.engine import restarts
from ddpfaults.faults import Plan, RankCrash
from ddpfaults.judge.results import FiredFault, Outcome, RankResult, RankState, UnfiredFault, WorldResult
from ddpfaults.spec import RunSpec


def _world(outcome=Outcome.COMPLETED, **fields) -> WorldResult:
    ranks = [RankResult(rank=r, state=RankState.FINISHED) for r in range(2)]
    return WorldResult(outcome, ranks, "", None, "ended", 1.0, spec=RunSpec(world_size=2, seed=7), **fields)


def test_a_replaced_result_is_new_and_leaves_the_one_it_came_from_as_it_was():
    verdict = _world()
    kept = dataclasses.replace(verdict, replay="python -m ddpfaults run x.py:f", reused=True)
    for name, value in [("replay", "other"), ("outcome", Outcome.HUNG), ("fired", []), ("anything", 1)]:
        with pytest.raises(dataclasses.FrozenInstanceError, match=f"cannot assign to field '{name}'"):
            setattr(kept, name, value)
    assert (kept.replay, kept.reused) == ("python -m ddpfaults run x.py:f", True)
    assert (verdict.replay, verdict.reused) == (None, False)  # a new result: the verdict is not touched
    assert kept.to_dict() == {**verdict.to_dict(), "replay": kept.replay, "reused": True}
    assert (kept.world_size, kept.seed, kept.spec) == (2, 7, verdict.spec)  # the settings come along


def test_a_torchrun_result_stays_one_when_replaced():
    verdict = WorldResult(Outcome.CRASHED, [], "x", None, "ended", 1.0, world_size=2, start_method="torchrun")
    kept = dataclasses.replace(verdict, preemption=None)
    assert (kept.launcher, kept.start_method, kept.to_dict()) == ("torchrun", "torchrun", verdict.to_dict())


def test_a_replaced_setting_that_contradicts_the_spec_is_refused_naming_it():
    """``dataclasses.replace`` passes the flat settings on as the result reads them from its spec; another value
    beside the spec is a second answer."""
    with pytest.raises(TypeError, match=r"seed=99 given with a spec that says otherwise"):
        dataclasses.replace(_world(), seed=99)
    assert dataclasses.replace(_world(), seed=7).seed == 7  # the spec's own value is no second answer


def test_the_attempts_merged_and_the_resume_finding_are_new_results():
    plan = Plan([RankCrash(rank=1, step=1), RankCrash(rank=0, step=1, attempt=1)], 2)
    first = _world(
        Outcome.CRASHED,
        unfired=[UnfiredFault(1, repr(plan[1]))],
        fired=[FiredFault(0, repr(plan[0]), 1, 1, "on_step")],
    )
    last = _world(unfired=[UnfiredFault(1, repr(plan[1]), (0,))])
    merged = restarts.merge([first, last], plan)
    assert [u.index for u in merged.unfired] == [1] and merged.unfired[0].finished == (0,)  # each attempt's own
    assert [a["outcome"] for a in merged.attempts] == ["crashed", "completed"]
    assert (first.attempts, last.attempts, last.unfired[0].finished) == ([], [], (0,))  # the attempts left alone
    single = restarts.run_attempts(lambda attempt: _world(resume_records=["per rank"]), Plan((), 2), 0)
    assert single.resume_records == [["per rank"]]
    checked = restarts.checking_resume(lambda plan: single, Plan((), 2), RunSpec(check_resume=True))
    assert checked.resume["equivalent"] is None and single.resume is None  # not resumed: a new result says so
