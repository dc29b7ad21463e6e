"""Unit tests of plan validation (no worlds): a plan is a list of faults, no two of them in conflict on one rank and
step, every fault's arguments keyword-only and checked at construction; refused before any world starts."""

from __future__ import annotations

import signal

import pytest

import ddpfaults
from ddpfaults.__main__ import main
from ddpfaults.errors import FaultArgumentError, FaultError, ScenarioError
from ddpfaults.faults import (
    DeviceMismatch,
    EmptyBatch,
    RankCrash,
    RankKilled,
    RankOnlyBarrier,
    SchemaDrift,
    SkippedCollective,
    Straggler,
    TornCheckpointWrite,
    UnevenInputs,
    WriterKilledMidSave,
    check_faults,
)
from ddpfaults.faults.base import check_plan, conflict

# -- a plan is a list of faults ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "plan, message",
    [
        (
            RankCrash(rank=1, step=2),
            "faults must be a list of faults; got RankCrash(rank=1, step=2, exc=RuntimeError('injected crash')) — "
            "wrap it in a list: faults=[RankCrash(",
        ),
        ("[EmptyBatch(rank=1, step=1)]", "faults must be a list of faults like [EmptyBatch(rank=1, step=2)]; got str"),
        (b"x", "got bytes b'x'"),
        ({"rank": 1}, "got dict {'rank': 1}"),
        (None, "got None (use [] for no faults)"),
        (3, "faults must be a list of faults like [EmptyBatch(rank=1, step=2)]; got 3"),
        ([EmptyBatch(rank=1, step=1), None], "faults[1] is None, not a ddpfaults fault"),
        ([{"kind": "EmptyBatch"}], "faults[0] is {'kind': 'EmptyBatch'}, not a ddpfaults fault"),
    ],
)
def test_a_plan_that_is_not_a_list_of_faults_is_refused_saying_what_it_got(plan, message):
    with pytest.raises(FaultError) as info:
        check_faults(plan, 4)
    assert message in str(info.value)


def test_run_world_and_run_script_refuse_a_bad_plan_before_any_world_starts():
    import os

    import rankfns

    with pytest.raises(FaultError, match=r"wrap it in a list: faults=\[RankCrash\(rank=1, step=2"):
        ddpfaults.run_world(rankfns.all_reduce_steps, world_size=2, faults=RankCrash(rank=1, step=2))
    two = [RankCrash(rank=1, step=1), RankCrash(rank=1, step=1, exc=KeyError("x"))]  # the second was ignored
    with pytest.raises(
        FaultError, match=r"faults\[0\] RankCrash.* and faults\[1\] RankCrash\(rank=1, step=1, exc=KeyE"
    ):
        ddpfaults.run_world(rankfns.all_reduce_steps, world_size=2, faults=two)
    script = os.path.join(os.path.dirname(rankfns.__file__), "scripts", "plain_train.py")
    with pytest.raises(FaultError, match="got str '\\[EmptyBatch"):
        ddpfaults.run_script(script, world_size=2, faults="[EmptyBatch(rank=1, step=1)]")
    with pytest.raises(FaultError, match="rank 2 does not exist in a world of 2 ranks"):
        ddpfaults.run_script(script, world_size=2, faults=[EmptyBatch(rank=2, step=1)])


def test_any_iterable_of_faults_is_a_plan():
    plan = [EmptyBatch(rank=1, step=1), Straggler(rank=0, step=1, seconds=0.5)]
    assert check_plan(iter(plan)) == tuple(plan) == check_plan(tuple(plan)) and check_plan([]) == ()


# -- conflicts ----------------------------------------------------------------------------------------

CONFLICTS = [
    (RankCrash(rank=1, step=2), RankCrash(rank=1, step=2), "both end the rank when the step starts"),
    (RankCrash(rank=1, step=2), RankKilled(rank=1, step=2), "both end the rank when the step starts"),
    (RankKilled(rank=[0, 1], step=[2, 3]), RankKilled(rank=1, step=3), "on rank 1 at step 3: both end the rank"),
    (RankCrash(rank=1, step=2), EmptyBatch(rank=1, step=2), "RankCrash ends the rank when the step starts, so "),
    (Straggler(rank=1, step=2, seconds=1), RankCrash(rank=1, step=2), "so Straggler could never act there"),
    (RankKilled(rank=1, step=2), SkippedCollective(rank=1, step=2), "so SkippedCollective could never act"),
    (RankCrash(rank=0, step=2), TornCheckpointWrite(writer=0, step=2), "so TornCheckpointWrite could never act"),
    (RankCrash(rank=1, step=2), SchemaDrift(key="k", rank=1, step=2), "so SchemaDrift could never act"),
    (EmptyBatch(rank=1, step=2), EmptyBatch(rank=[0, 1], step=[2, 3]), "on rank 1 at step 2: both empty the batch"),
    (SchemaDrift(key="k"), SchemaDrift(key="k", rank=1, step=3), "on rank 1 at step 3: both drop key 'k'"),
    (DeviceMismatch(), DeviceMismatch(rank=2, device_type="hpu"), "on rank 2 at every step: both choose the devices"),
    (UnevenInputs(rank=[0, 2], batches=2), UnevenInputs(rank=2, batches=3), "both cut the rank's DataLoader short"),
    (SkippedCollective(rank=1, step=2), SkippedCollective(rank=1, step=2), "both skip the first collective"),
    (SkippedCollective(rank=1, step=2), SkippedCollective(rank=1, step=2, op="barrier"), "skip the first barrier"),
    (RankOnlyBarrier(rank=1, step=2), RankOnlyBarrier(rank=1, step=2), "both call the lone barrier"),
    (RankOnlyBarrier(rank=1, step=2), SkippedCollective(rank=1, step=2), "the skip would swallow the lone barrier"),
    (RankOnlyBarrier(rank=1, step=2), SkippedCollective(rank=1, step=2, op="barrier"), "swallow the lone barrier"),
    (
        TornCheckpointWrite(writer=0, step=2),
        WriterKilledMidSave(writer=0, step=2),
        "interrupt the step's checkpoint save",
    ),
    (TornCheckpointWrite(writer=0, step=2), TornCheckpointWrite(writer=1, step=2), "on every rank at step 2"),
    (WriterKilledMidSave(writer=0), TornCheckpointWrite(writer=0, step=4), "interrupt the step's checkpoint save"),
]

COMPOSE = [
    (RankCrash(rank=1, step=2), RankCrash(rank=1, step=3)),
    (RankCrash(rank=1, step=2), RankCrash(rank=0, step=2)),
    (RankCrash(rank=1, step=2), SchemaDrift(key="k")),  # every rank, every step: it still acts elsewhere
    (RankCrash(rank=1, step=2), SchemaDrift(key="k", step=2)),
    (RankCrash(rank=1, step=2), DeviceMismatch()),
    (RankCrash(rank=1, step=2), UnevenInputs(rank=1, batches=1)),
    (RankCrash(rank=1, step=2), EmptyBatch(rank=1, step=3)),
    (Straggler(rank=1, step=2, seconds=1), Straggler(rank=1, step=2, seconds=1)),  # delays add up
    (Straggler(rank=1, step=2, seconds=1), EmptyBatch(rank=1, step=2)),
    (Straggler(rank=1, step=2, seconds=1), RankOnlyBarrier(rank=1, step=2)),
    (EmptyBatch(rank=1, step=2), SchemaDrift(key="k", rank=1, step=2)),
    (EmptyBatch(rank=1, step=2), EmptyBatch(rank=2, step=2)),
    (SchemaDrift(key="k"), SchemaDrift(key="j")),
    (SkippedCollective(rank=1, step=2, op="all_reduce"), SkippedCollective(rank=1, step=2, op="barrier")),
    (SkippedCollective(rank=1, step=2), SkippedCollective(rank=1, step=2, op="ddp_bucket")),
    (RankOnlyBarrier(rank=1, step=2), SkippedCollective(rank=1, step=2, op="all_reduce")),
    (WriterKilledMidSave(writer=0, step=2), EmptyBatch(rank=0, step=2)),
    (WriterKilledMidSave(writer=0, step=2), Straggler(rank=0, step=2, seconds=1)),
    (TornCheckpointWrite(writer=0, step=1), WriterKilledMidSave(writer=0, step=2)),
    (DeviceMismatch(rank=1), DeviceMismatch(rank=2)),
    (UnevenInputs(rank=1, batches=2), UnevenInputs(rank=2, batches=2)),
]


@pytest.mark.parametrize("first, second, why", CONFLICTS, ids=lambda v: repr(v) if not isinstance(v, str) else "")
def test_conflicting_faults_are_refused_naming_both(first, second, why):
    for a, b in ((first, second), (second, first)):
        plan = [Straggler(rank=3, step=0, seconds=1), a, b]
        with pytest.raises(FaultError) as info:
            check_faults(plan, 4)
        text = str(info.value)
        assert text.startswith(f"faults[1] {a!r} and faults[2] {b!r} conflict on "), text
        assert why in text and "move one to another rank or step, or drop one" in text, text


@pytest.mark.parametrize("first, second", COMPOSE, ids=repr)
def test_faults_that_compose_are_accepted(first, second):
    assert conflict(first, second) is None and conflict(second, first) is None
    assert check_faults([first, second], 4) == (first, second)


def test_scenarios_and_variants_refuse_bad_plans_naming_the_scenario():
    with pytest.raises(ScenarioError, match="scenario lone: faults must be a list of faults; got RankCrash"):
        ddpfaults.scenario(faults=RankCrash(rank=1, step=1), name="lone")(_declared)
    with pytest.raises(ScenarioError, match=r"scenario twice: faults\[0\] .* conflict on rank 1 at step 1"):
        ddpfaults.scenario(faults=[EmptyBatch(rank=1, step=1)] * 2, name="twice")(_declared)
    with pytest.raises(ScenarioError, match="variant naive: faults must be a list of faults; got EmptyBatch"):
        ddpfaults.variant("naive", faults=EmptyBatch(rank=1, step=1))


def _declared(ctx):
    """A module-level function to declare scenarios on."""


def test_the_cli_refuses_a_conflicting_plan_before_any_world(capsys):
    code = main(
        [
            "run",
            "tests/support/rankfns.py:all_reduce_steps",
            "--faults",
            "[RankCrash(rank=1, step=1), RankKilled(rank=1, step=1)]",
        ]
    )
    assert code == 2
    assert "conflict on rank 1 at step 1: both end the rank" in capsys.readouterr().err


def test_a_fault_plan_refuses_conflicts_and_plan_union_leaves_them_out():
    from hypothesis import find
    from hypothesis import strategies as st

    from ddpfaults.strategies import FaultPlan, fault_plans, plan_union

    assert FaultPlan([EmptyBatch(rank=1, step=1)] * 2) == FaultPlan([EmptyBatch(rank=1, step=1)])  # repeats merge
    with pytest.raises(FaultError, match=r"FaultPlan: faults\[.\] .* conflict on rank 1 at step 1"):
        FaultPlan([EmptyBatch(rank=1, step=1), RankCrash(rank=1, step=1)])
    union = plan_union(
        st.just(FaultPlan([RankCrash(rank=1, step=1)])), st.just(FaultPlan([EmptyBatch(rank=1, step=1)]))
    )
    assert find(union, lambda p: True) == FaultPlan([RankCrash(rank=1, step=1)])
    crash_and_batch = fault_plans(world_size=2, steps=2, kinds=(EmptyBatch, RankCrash))
    both = find(crash_and_batch, lambda p: len({type(f) for f in p}) == 2)  # both kinds, never on one cell
    assert check_faults(both, 2) == both.faults


# -- every fault's arguments ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: RankCrash(1, 2), "RankCrash: too many positional arguments (RankCrash's arguments, keyword-only: "),
        (lambda: EmptyBatch(rank=1, steps=2), "EmptyBatch: unknown argument 'steps' (EmptyBatch's arguments, "),
        (lambda: EmptyBatch(rank=1), "EmptyBatch: missing a required argument: 'step'"),
        (lambda: TornCheckpointWrite(0), "TornCheckpointWrite: too many positional arguments"),
        (lambda: UnevenInputs(rank=1, batches=2, step=1), "UnevenInputs: unknown argument 'step'"),
        (lambda: Straggler(rank=1, step=1, second=2), "keyword-only: rank, step, seconds)"),
    ],
)
def test_positional_unknown_or_missing_arguments_are_fault_argument_errors(make, message):
    with pytest.raises(FaultArgumentError) as info:
        make()
    assert isinstance(info.value, FaultError) and isinstance(info.value, TypeError)
    assert message in str(info.value)


class NeedsTwo(Exception):
    """An exception whose constructor takes two arguments but passes one to Exception: it cannot be unpickled."""

    def __init__(self, a, b):
        super().__init__(a)


def _local_exception():
    class Local(Exception):
        pass

    return Local("x")


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: RankKilled(rank=1, step=1, signal=signal.SIGTSTP), "RankKilled: signal SIGTSTP does not kill a rank"),
        (lambda: RankKilled(rank=1, step=1, signal=signal.SIGCHLD), "RankKilled: signal SIGCHLD does not kill a rank"),
        (lambda: RankKilled(rank=1, step=1, signal=signal.SIGSTOP), "RankKilled: signal SIGSTOP does not kill a rank"),
        (lambda: RankKilled(rank=1, step=1, signal=15.0), "RankKilled: signal must be a signal number"),
        (lambda: RankKilled(rank=1, step=1, signal="SIGTERM"), "RankKilled: signal must be a signal number"),
        (lambda: RankCrash(rank=1, step=1, exc=NeedsTwo), "RankCrash: exc=NeedsTwo cannot be built as NeedsTwo("),
        (lambda: RankCrash(rank=1, step=1, exc=NeedsTwo(1, 2)), "RankCrash: exc=NeedsTwo(1) cannot travel"),
        (lambda: RankCrash(rank=1, step=1, exc=_local_exception()), "cannot travel to the rank: pickling it fails"),
        (lambda: SkippedCollective(rank=1, step=1, op=["all_reduce"]), "SkippedCollective: op must be None"),
    ],
)
def test_fault_fields_are_validated_at_construction(make, message):
    with pytest.raises(FaultError) as info:
        make()
    assert message in str(info.value)


def test_killing_signals_are_accepted():
    for sig in (signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGABRT, signal.SIGSEGV, int(signal.SIGBUS)):
        assert RankKilled(rank=0, step=0, signal=sig).signal == sig
