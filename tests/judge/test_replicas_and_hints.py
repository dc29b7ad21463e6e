"""Replica checks that can fail (``values_equal`` on return values, or on the digests of the modules the ranks
wrapped) and the hints a never-fired fault gives: unit tests on hand-built results."""

from __future__ import annotations

import pytest

from ddpfaults import Expect, Outcome, RankResult, RankState, WorldResult
from ddpfaults.faults import OutOfMemory, SkippedCollective
from ddpfaults.judge.results import Collective
from ddpfaults.judge.verdict import unfired_faults

EQUAL = Expect("completed", values_equal=True)


def wrapped(digest: str, *, sharded: bool = False) -> dict:
    return {"index": 0, "kind": "ddp", "type": "Linear", "site": "train.py:21 in main", "sharded": sharded,
            "digest": digest}  # fmt: skip


def world(values=(None, None), wraps=([], [])) -> WorldResult:
    ranks = [
        RankResult(rank=r, state=RankState.FINISHED, value=v, wrapped=list(w))
        for r, (v, w) in enumerate(zip(values, wraps, strict=True))
    ]
    return WorldResult(Outcome.COMPLETED, ranks, "no failure", None, "ended", 0.5, 2, 0, step_clock="optimizer")


def texts(result: WorldResult) -> list[str]:
    return [m.text for m in EQUAL.mismatches(result)]


def test_equal_digests_hold_and_differing_ones_fail_naming_the_module_and_each_rank():
    assert texts(world(wraps=([wrapped("a" * 64)], [wrapped("a" * 64)]))) == []
    (text,) = texts(world(wraps=([wrapped("a" * 64)], [wrapped("b" * 64)])))
    assert text == (
        "replicas differ: module #0 (Linear, wrapped in DDP at train.py:21 in main) ends with a different state per "
        "rank: rank 0 aaaaaaaaaaaa, rank 1 bbbbbbbbbbbb"
    )


@pytest.mark.parametrize(
    "wraps, why",
    [
        (([], []), "no rank returned a value and none wrapped a module in DDP or FSDP"),
        (([wrapped("a", sharded=True)], [wrapped("b", sharded=True)]), "every module it wrapped is sharded by FSDP"),
    ],
    ids=["nothing-returned-nothing-wrapped", "sharded-only"],
)
def test_values_equal_with_nothing_to_compare_fails_saying_why(wraps, why):
    (text,) = texts(world(wraps=wraps))
    assert text.startswith("values_equal compared nothing: ") and why in text


def test_ranks_that_wrapped_different_numbers_of_modules_differ_and_return_values_win_over_digests():
    (text,) = texts(world(wraps=([wrapped("a")], [])))
    assert text == "the ranks wrapped different numbers of modules in DDP/FSDP: [1, 0] (rank by rank)"
    assert texts(world(values=(1.0, 1.0), wraps=([wrapped("a")], [wrapped("b")]))) == []
    assert texts(world(values=(1.0, 2.0)))[0] == "expected every rank to return the same value, observed [1.0, 2.0]"


def call(op: str, maker: str, step: int = 2) -> Collective:
    return Collective(seq=1, op=op, shapes=[[4]], site="train.py:9 in main", step=step, maker=maker)


@pytest.mark.parametrize(
    "fault, calls, hint",
    [
        (SkippedCollective(rank=1, step=2), [call("all_reduce", "ddp_bucket")], "give op='ddp_bucket' to skip one"),
        (SkippedCollective(rank=1, step=2), [], "made no collective of its own at its step: give op='ddp_bucket'"),
        (SkippedCollective(rank=1, step=2, op="barrier"), [call("all_reduce", "user")], "had no barrier (the code"),
        (OutOfMemory(rank=1, step=2), [], "no allocation of its step failed under the address-space limit"),
    ],
    ids=["ddp-buckets-only", "no-collective", "other-op", "out-of-memory"],
)
def test_a_fault_that_never_fired_says_why_from_what_its_step_had(fault, calls, hint):
    ranks = [
        RankResult(rank=r, state=RankState.FINISHED, collectives=calls + [call("broadcast", "user", step=9)])
        for r in range(2)
    ]
    (unfired,) = unfired_faults([fault], ranks, fired=[])
    assert hint in unfired.hint and unfired.describe().endswith(unfired.hint)


def test_a_skip_whose_step_had_its_collective_gives_no_hint():
    ranks = [RankResult(rank=r, state=RankState.FINISHED, collectives=[call("all_reduce", "user")]) for r in range(2)]
    (unfired,) = unfired_faults([SkippedCollective(rank=1, step=2)], ranks, fired=[])
    assert unfired.hint == ""
