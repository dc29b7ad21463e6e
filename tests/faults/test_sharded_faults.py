"""Unit tests of the sharded-training faults: the DCP fault values, and the ops that pick FSDP2's and DCP's
collectives by their maker (matching and conflicts)."""

import signal

import pytest

import ddpfaults.faults
from ddpfaults.errors import FaultError
from ddpfaults.faults import (
    AsyncSaveKilled,
    CheckpointNotVisible,
    DroppedLink,
    RankCrash,
    RankKilled,
    SkippedCollective,
    SlowLink,
    TornDcpWrite,
    check_faults,
)
from ddpfaults.faults.base import check_plan
from ddpfaults.faults.plan import parse_plan
from ddpfaults.faults.step import LIBRARY_OPS, op_matches, ops_overlap

FAULTS = [
    TornDcpWrite(writer=1, step=1),
    TornDcpWrite(writer=0, step=[1, 3], part="metadata", killed=True),
    CheckpointNotVisible(rank=1, step=2),
    CheckpointNotVisible(rank=[0, 2], step=[2, 4]),
    AsyncSaveKilled(writer=1, step=1),
    SkippedCollective(rank=1, step=1, op="fsdp_reduce_scatter"),
    SlowLink(rank=0, step=2, op="fsdp_all_gather", delay=0.5),
    DroppedLink(rank=1, step=1, op="dcp"),
    RankCrash(rank=1, step=2, op="fsdp_all_gather"),
    RankKilled(rank=1, step=2, signal=signal.SIGTERM, op="dcp"),
]


@pytest.mark.parametrize("fault", FAULTS, ids=repr)
def test_repr_parses_back_into_the_fault(fault):
    assert parse_plan(repr([fault])) == [fault]
    assert eval(repr(fault), {**vars(ddpfaults.faults), "signal": signal}) == fault
    assert check_faults([fault], 4) == (fault,)


def test_repr_examples_and_properties():
    assert repr(TornDcpWrite(writer=1, step=1)) == "TornDcpWrite(writer=1, step=1)"
    torn = TornDcpWrite(step=2, part="metadata", killed=True)
    assert repr(torn) == "TornDcpWrite(writer=0, step=2, part='metadata', killed=True)"
    assert torn.kills_with == "SIGKILL" and TornDcpWrite(writer=1, step=1).kills_with is None
    assert AsyncSaveKilled(writer=2, step=0).writer == 2 and AsyncSaveKilled(writer=2, step=0).kills_with == "SIGKILL"
    assert CheckpointNotVisible.data_only and not TornDcpWrite.data_only and not AsyncSaveKilled.data_only


def test_a_torn_write_wants_its_own_part_only():
    shard = TornDcpWrite(writer=1, step=1)
    assert shard.wants("__1_0.distcp") and not shard.wants("__0_0.distcp") and not shard.wants("__11_0.distcp")
    assert not shard.wants(".metadata.tmp")
    metadata = TornDcpWrite(step=1, part="metadata")
    assert metadata.wants(".metadata.tmp") and metadata.wants(".metadata") and not metadata.wants("__0_0.distcp")


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: TornDcpWrite(writer=True, step=1), "writer must be a non-negative int"),
        (lambda: TornDcpWrite(writer=1, step=1, part="data"), "part must be one of 'shard', 'metadata'"),
        (lambda: TornDcpWrite(writer=1, step=1, killed=1), "killed must be True or False"),
        (lambda: AsyncSaveKilled(writer="1", step=1), "writer must be a non-negative int"),
        (lambda: CheckpointNotVisible(rank=None, step=1), "rank is required"),
        (lambda: CheckpointNotVisible(rank=1, step=None), "step is required"),
        (lambda: SkippedCollective(rank=1, step=1, op="fsdp"), "op must be None, 'ddp_bucket', one of"),
    ],
)
def test_bad_arguments_are_refused(make, message):
    with pytest.raises(FaultError, match=message):
        make()


@pytest.mark.parametrize(
    "first, second",
    [
        (TornDcpWrite(writer=1, step=1), TornDcpWrite(writer=1, step=1, part="metadata")),
        (TornDcpWrite(writer=1, step=1), AsyncSaveKilled(writer=1, step=1)),
        (CheckpointNotVisible(rank=1, step=2), CheckpointNotVisible(rank=[1, 2], step=2)),
        (SkippedCollective(rank=1, step=1, op="fsdp_all_gather"), SkippedCollective(rank=1, step=1)),
        (SkippedCollective(rank=1, step=1, op="dcp"), SkippedCollective(rank=1, step=1, op="gather_object")),
        (
            SkippedCollective(rank=1, step=1, op="fsdp_all_gather"),
            SlowLink(rank=1, step=1, op="all_gather_single", delay=1),
        ),
    ],
)
def test_faults_on_one_event_conflict(first, second):
    with pytest.raises(FaultError, match="conflict"):
        check_plan([first, second])


@pytest.mark.parametrize(
    "first, second",
    [
        (TornDcpWrite(writer=1, step=1), TornDcpWrite(writer=1, step=2)),
        (TornDcpWrite(writer=1, step=1), CheckpointNotVisible(rank=1, step=1)),
        (SkippedCollective(rank=1, step=1, op="fsdp_all_gather"), SkippedCollective(rank=1, step=1, op="dcp")),
        (
            SkippedCollective(rank=1, step=1, op="fsdp_reduce_scatter"),
            SkippedCollective(rank=1, step=1, op="ddp_bucket"),
        ),
        (SkippedCollective(rank=1, step=1, op="all_reduce"), SkippedCollective(rank=1, step=1, op="barrier")),
    ],
)
def test_faults_that_compose_are_accepted(first, second):
    assert check_plan([first, second]) == (first, second)


def test_a_library_op_picks_its_makers_calls_and_no_other():
    assert op_matches("fsdp_all_gather", "all_gather_single", "fsdp_all_gather")
    assert not op_matches("fsdp_all_gather", "all_gather_single", "user")
    assert not op_matches("fsdp_reduce_scatter", "all_gather_single", "fsdp_all_gather")
    assert op_matches("dcp", "gather_object", "dcp") and not op_matches("dcp", "gather_object", "user")
    assert op_matches(None, "reduce_scatter_single", "fsdp_reduce_scatter") and not op_matches(None, "ddp_bucket")
    assert op_matches("all_gather_single", "all_gather_single", "fsdp_all_gather")  # by its name, whoever made it
    assert all(not ops_overlap(op, "ddp_bucket") for op in LIBRARY_OPS)
    assert ops_overlap("fsdp_all_gather", None) and ops_overlap("fsdp_all_gather", "all_gather_single")
    assert not ops_overlap("fsdp_all_gather", "fsdp_reduce_scatter")


class _Ctx:
    """What a fault's collective hook asks of a rank context: once per step, and the fired records."""

    def __init__(self):
        self.fired, self.asked = [], set()

    def once(self, fault):
        first = fault not in self.asked
        self.asked.add(fault)
        return first

    def record_fired(self, fault, how, *, effect, signal=None):
        self.fired.append((how, effect, signal))


def test_a_crash_with_an_op_waits_for_its_collective_and_one_without_acts_on_its_step():
    assert RankCrash(rank=1, step=1).acts_on_step and not RankCrash(rank=1, step=1, op="dcp").acts_on_step
    assert repr(RankKilled(rank=1, step=2, op="fsdp_reduce_scatter")) == (
        "RankKilled(rank=1, step=2, op='fsdp_reduce_scatter')"
    )
    crash, ctx = RankCrash(rank=1, step=1, op="fsdp_reduce_scatter"), _Ctx()
    assert crash.before_collective(ctx, "all_gather_single", "fsdp_all_gather") is None and ctx.fired == []
    with pytest.raises(RuntimeError, match="injected crash"):
        crash.before_collective(ctx, "reduce_scatter_single", "fsdp_reduce_scatter")
    assert ctx.fired == [("entering reduce_scatter_single (FSDP reduce-scatter)", "at_collective", None)]
    assert RankKilled(rank=1, step=1, op="ddp_bucket").acts_on_ddp_buckets(1)
    with pytest.raises(FaultError, match="conflict"):  # it still ends the rank within its step
        check_plan([RankKilled(rank=1, step=1, op="dcp"), SkippedCollective(rank=1, step=1, op="fsdp_all_gather")])
