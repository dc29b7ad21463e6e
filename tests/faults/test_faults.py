"""Unit tests of ddpfaults.faults: construction, validation, repr, applies (no processes)."""

from __future__ import annotations

import math

import pytest

import ddpfaults.faults
from ddpfaults.errors import DDPFaultsError, FaultError
from ddpfaults.faults import (
    Fault,
    RankCrash,
    RankOnlyBarrier,
    SkippedCollective,
    Straggler,
    check_faults,
)

FAULT_NAMESPACE = vars(ddpfaults.faults)

ALL_FAULTS = [
    Fault(),
    Fault(rank=2),
    Fault(step=[3, 1]),
    Fault(rank=[0, 2], step=5),
    RankCrash(rank=1, step=3),
    RankCrash(rank=[1, 3], step=[2, 4], exc=KeyError("segment_mask")),
    RankCrash(rank=0, step=0, exc=ValueError),
    RankCrash(rank=2, step=1, exc=RuntimeError()),
    RankCrash(rank=2, step=1, exc=OSError(5, "Input/output error")),
    Straggler(rank=1, step=2, seconds=3),
    Straggler(rank=[0, 1], step=[2, 7], seconds=0.25),
    SkippedCollective(rank=3, step=2),
    SkippedCollective(rank=3, step=2, op="all_reduce"),
    RankOnlyBarrier(rank=0, step=1),
]


def _ids(fault):
    return repr(fault)


# -- errors -------------------------------------------------------------------------------


def test_fault_error_is_a_ddpfaults_error_and_a_value_error():
    assert issubclass(FaultError, DDPFaultsError)
    assert issubclass(FaultError, ValueError)


# -- keyword-only constructors ------------------------------------------------------------


@pytest.mark.parametrize(
    "make",
    [
        lambda: Fault(1),
        lambda: Fault(1, 2),
        lambda: RankCrash(1, 2),
        lambda: RankCrash(1, step=2),
        lambda: Straggler(1, 2, 3.0),
        lambda: SkippedCollective(1, 2),
        lambda: SkippedCollective(1, 2, "all_reduce"),
        lambda: RankOnlyBarrier(0, 1),
    ],
)
def test_positional_arguments_raise_type_error(make):
    with pytest.raises(TypeError):
        make()


@pytest.mark.parametrize(
    "make",
    [
        lambda: RankCrash(step=1),
        lambda: RankCrash(rank=1),
        lambda: Straggler(rank=1, step=1),
        lambda: SkippedCollective(rank=1),
        lambda: RankOnlyBarrier(step=1),
    ],
)
def test_missing_required_arguments_raise_type_error(make):
    with pytest.raises(TypeError):
        make()


# -- validation --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make",
    [
        lambda: Fault(rank=-1),
        lambda: Fault(step=-1),
        lambda: Fault(rank=[0, -2]),
        lambda: Fault(rank=True),
        lambda: Fault(step=False),
        lambda: Fault(rank=[1, True]),
        lambda: Fault(rank=[]),
        lambda: Fault(step=()),
        lambda: Fault(rank="0"),
        lambda: Fault(rank=["1"]),
        lambda: RankCrash(rank=-1, step=0),
        lambda: RankCrash(rank=True, step=0),
        lambda: RankCrash(rank=[], step=0),
        lambda: RankCrash(rank=None, step=0),
        lambda: RankCrash(rank=0, step=None),
        lambda: RankCrash(rank=0, step=[]),
        lambda: RankCrash(rank=0, step=0, exc="boom"),
        lambda: RankCrash(rank=0, step=0, exc=42),
        lambda: RankCrash(rank=0, step=0, exc=int),
        lambda: Straggler(rank=0, step=0, seconds=0),
        lambda: Straggler(rank=0, step=0, seconds=-1.5),
        lambda: Straggler(rank=0, step=0, seconds=True),
        lambda: Straggler(rank=0, step=0, seconds="2"),
        lambda: Straggler(rank=0, step=0, seconds=None),
        lambda: Straggler(rank=None, step=0, seconds=1),
        lambda: SkippedCollective(rank=0, step=0, op=3),
        lambda: SkippedCollective(rank=0, step=0, op="allreduce"),
        lambda: SkippedCollective(rank=0, step=None),
        lambda: RankOnlyBarrier(rank=None, step=1),
        lambda: RankOnlyBarrier(rank=0, step=-3),
    ],
)
def test_invalid_values_raise_fault_error(make):
    with pytest.raises(FaultError) as info:
        make()
    assert isinstance(info.value, DDPFaultsError)
    assert str(info.value)  # the message is never empty


def test_fault_error_message_names_the_fault_and_the_argument():
    with pytest.raises(
        FaultError,
        match=r"SkippedCollective: op must be None, 'ddp_bucket', one of 'fsdp_all_gather', .*all_reduce.*'allreduce'",
    ):
        SkippedCollective(rank=0, step=0, op="allreduce")
    with pytest.raises(FaultError, match=r"RankCrash: rank .*-1"):
        RankCrash(rank=-1, step=0)
    with pytest.raises(FaultError, match=r"Straggler: seconds .*0"):
        Straggler(rank=0, step=0, seconds=0)
    with pytest.raises(FaultError, match=r"RankCrash: exc .*'boom'"):
        RankCrash(rank=0, step=0, exc="boom")


def test_ranks_and_steps_are_normalised_to_sorted_unique_tuples():
    f = RankCrash(rank=[3, 1, 3], step=(4, 2, 2))
    assert f.ranks == (1, 3)
    assert f.steps == (2, 4)
    assert Fault().ranks is None and Fault().steps is None
    assert Fault(rank=range(3)).ranks == (0, 1, 2)


def test_rank_crash_exc_class_becomes_an_instance():
    f = RankCrash(rank=0, step=0, exc=KeyError)
    assert type(f.exc) is KeyError
    default = RankCrash(rank=0, step=0)
    assert type(default.exc) is RuntimeError and default.exc.args == ("injected crash",)


def test_straggler_seconds_is_float():
    s = Straggler(rank=0, step=0, seconds=2)
    assert s.seconds == 2.0 and isinstance(s.seconds, float)


# A non-int, non-iterable rank/step (1.0, object()) is a FaultError naming the fault, not a bare TypeError.
@pytest.mark.parametrize(
    "make",
    [
        lambda: RankCrash(rank=1.0, step=0),
        lambda: RankCrash(rank=0, step=2.5),
        lambda: Fault(rank=object()),
    ],
)
def test_non_integer_scalar_rank_or_step_raises_fault_error(make):
    with pytest.raises(FaultError):
        make()


# NaN would pass a `seconds <= 0` check and then make the straggler do nothing.
def test_straggler_rejects_nan_seconds():
    with pytest.raises(FaultError):
        Straggler(rank=0, step=0, seconds=math.nan)


# seconds=inf would have a repr ("seconds=inf") that is not valid Python: it is rejected.
def test_straggler_rejects_infinite_seconds():
    with pytest.raises(FaultError, match="positive finite"):
        Straggler(rank=0, step=0, seconds=math.inf)


# -- check_world / check_faults -----------------------------------------------------------


def test_check_world_message_names_rank_and_world_size():
    f = RankCrash(rank=5, step=0)
    with pytest.raises(FaultError) as info:
        f.check_world(4)
    message = str(info.value)
    assert "5" in message and "4" in message
    assert "rank 5" in message and "world of 4" in message
    assert isinstance(info.value, DDPFaultsError)


@pytest.mark.parametrize(
    "fault",
    [
        RankCrash(rank=4, step=0),
        Straggler(rank=[0, 6], step=1, seconds=1),
        SkippedCollective(rank=[1, 2, 9], step=0),
        RankOnlyBarrier(rank=4, step=0),
        Fault(rank=100),
    ],
    ids=_ids,
)
def test_check_world_rejects_ranks_outside_the_world(fault):
    bad = max(fault.ranks)
    with pytest.raises(FaultError) as info:
        fault.check_world(4)
    assert f"rank {bad} " in str(info.value)
    assert "world of 4" in str(info.value)
    with pytest.raises(FaultError):
        check_faults([fault], 4)


@pytest.mark.parametrize("fault", ALL_FAULTS, ids=_ids)
def test_check_world_accepts_faults_inside_the_world(fault):
    assert fault.check_world(4) is None
    assert check_faults([fault], 4) == (fault,)


def test_check_world_boundary():
    RankCrash(rank=3, step=0).check_world(4)
    with pytest.raises(FaultError, match="rank 1 "):
        RankCrash(rank=1, step=0).check_world(1)


def test_check_faults_returns_a_tuple_and_accepts_any_iterable():
    plan = [RankCrash(rank=1, step=2), Straggler(rank=0, step=1, seconds=0.5)]
    assert check_faults(plan, 2) == tuple(plan)
    assert check_faults(iter(plan), 2) == tuple(plan)
    assert check_faults([], 1) == ()


@pytest.mark.parametrize("bad", ["RankCrash(rank=0, step=0)", RankCrash, None, 3])
def test_check_faults_rejects_non_faults_naming_the_index(bad):
    with pytest.raises(FaultError) as info:
        check_faults([RankCrash(rank=0, step=0), Straggler(rank=1, step=0, seconds=1), bad], 4)
    assert "faults[2]" in str(info.value)
    assert repr(bad) in str(info.value)


def test_check_faults_names_the_first_bad_fault_in_the_world():
    with pytest.raises(FaultError, match="rank 7 "):
        check_faults([RankCrash(rank=1, step=0), SkippedCollective(rank=7, step=1)], 2)


# -- repr / equality ----------------------------------------------------------------------


@pytest.mark.parametrize("fault", ALL_FAULTS, ids=_ids)
def test_repr_is_valid_python_rebuilding_the_fault(fault):
    rebuilt = eval(repr(fault), dict(FAULT_NAMESPACE))
    assert type(rebuilt) is type(fault)
    assert rebuilt == fault
    assert hash(rebuilt) == hash(fault)
    assert repr(rebuilt) == repr(fault)
    assert rebuilt.ranks == fault.ranks and rebuilt.steps == fault.steps


def test_repr_examples():
    assert repr(RankCrash(rank=1, step=[4, 2])) == "RankCrash(rank=1, step=[2, 4], exc=RuntimeError('injected crash'))"
    assert repr(Straggler(rank=0, step=3, seconds=2)) == "Straggler(rank=0, step=3, seconds=2.0)"
    assert repr(SkippedCollective(rank=2, step=1, op="barrier")) == "SkippedCollective(rank=2, step=1, op='barrier')"
    assert repr(RankOnlyBarrier(rank=0, step=1)) == "RankOnlyBarrier(rank=0, step=1)"
    assert repr(Fault()) == "Fault()"


def test_rebuilt_rank_crash_keeps_the_exception():
    f = RankCrash(rank=1, step=0, exc=KeyError("segment_mask"))
    rebuilt = eval(repr(f), dict(FAULT_NAMESPACE))
    assert type(rebuilt.exc) is KeyError and rebuilt.exc.args == ("segment_mask",)


def test_equality_depends_on_type_and_arguments():
    assert RankCrash(rank=1, step=2) == RankCrash(rank=[1], step=(2,))
    assert RankCrash(rank=1, step=2) != RankCrash(rank=1, step=3)
    assert RankCrash(rank=1, step=2) != RankCrash(rank=1, step=2, exc=KeyError("x"))
    assert RankOnlyBarrier(rank=1, step=2) != SkippedCollective(rank=1, step=2)
    assert Straggler(rank=0, step=1, seconds=1) != Straggler(rank=0, step=1, seconds=2)
    assert SkippedCollective(rank=0, step=1) != SkippedCollective(rank=0, step=1, op="all_reduce")
    assert len({RankCrash(rank=1, step=2), RankCrash(rank=[1], step=[2])}) == 1
    assert RankCrash(rank=1, step=2) != "RankCrash(rank=1, step=2, exc=RuntimeError('injected crash'))"


# -- applies --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "rank, step, expected",
    [
        (1, 2, True),
        (1, 4, True),
        (3, 2, True),
        (3, 4, True),
        (1, 3, False),  # right rank, wrong step
        (0, 2, False),  # wrong rank, right step
        (2, 4, False),
        (1, None, False),  # outside any step
    ],
)
def test_applies_with_ranks_and_steps(rank, step, expected):
    assert RankCrash(rank=[1, 3], step=[2, 4]).applies(rank, step) is expected


def test_applies_without_steps_means_every_step_and_outside_steps():
    f = Fault(rank=2)
    assert f.applies(2, 0) and f.applies(2, 99) and f.applies(2, None)
    assert not f.applies(1, 0)


def test_applies_without_ranks_means_every_rank():
    f = Fault(step=3)
    assert all(f.applies(r, 3) for r in range(8))
    assert not f.applies(0, 2)
    assert not f.applies(0, None)
    assert Fault().applies(5, None)
