"""Faults that name a process group (a mesh dimension's name or its member ranks) and point-to-point or all-to-all
ops: validated at construction, shown in their repr, acting only on calls made in that group."""

from __future__ import annotations

import types

import pytest

from ddpfaults.errors import FaultError
from ddpfaults.faults import DroppedLink, RankKilled, SkippedCollective, SlowLink


@pytest.mark.parametrize("kind", [SkippedCollective, DroppedLink])
def test_a_group_is_a_dimension_name_or_member_ranks(kind):
    assert kind(rank=1, step=0, op="all_reduce", group="tp").group == "tp"
    fault = kind(rank=1, step=0, op="all_reduce", group=[3, 1])
    assert fault.group == (1, 3) and "group=[1, 3]" in repr(fault)
    assert SlowLink(rank=1, step=0, op="send", group="pp", delay=0.1).group == "pp"


@pytest.mark.parametrize("group", ["", [], [1, 1], [-1], [True], 3, [0.5]])
def test_a_bad_group_is_refused_naming_the_fault_and_the_value(group):
    with pytest.raises(FaultError, match=r"SkippedCollective: group must be a mesh dimension name .* got"):
        SkippedCollective(rank=0, step=0, op="all_reduce", group=group)


def test_a_rank_killed_in_a_group_needs_the_op_it_dies_entering():
    assert "group='dp'" in repr(RankKilled(rank=0, step=1, op="all_reduce", group="dp"))
    with pytest.raises(FaultError, match="RankKilled: group needs op"):
        RankKilled(rank=0, step=1, group="dp")


@pytest.mark.parametrize("op", ["send", "recv", "isend", "irecv", "all_to_all", "all_to_all_single"])
def test_point_to_point_and_all_to_all_ops_are_taken(op):
    assert SkippedCollective(rank=0, step=0, op=op).op == op


def test_a_group_fault_acts_only_on_calls_in_its_group():
    by_name = SkippedCollective(rank=0, step=0, op="all_reduce", group="tp")
    by_ranks = SkippedCollective(rank=0, step=0, op="all_reduce", group=[0, 2])
    anywhere = SkippedCollective(rank=0, step=0, op="all_reduce")
    tp, dp, default = ([0, 1], "mesh_tp"), ([0, 2], "mesh_dp"), None
    at = {name: types.SimpleNamespace(call_group=g) for name, g in (("tp", tp), ("dp", dp), ("default", default))}
    assert [by_name.matches_at(at[n], "all_reduce") for n in at] == [True, False, False]
    assert [by_ranks.matches_at(at[n], "all_reduce") for n in at] == [False, True, False]
    assert [anywhere.matches_at(at[n], "all_reduce") for n in at] == [True, True, True]
    assert not by_name.matches_at(at["tp"], "barrier")
