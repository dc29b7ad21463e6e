"""Process groups told apart: a group's identity read from a flight record whatever order the rank made its groups
in, and each group's collectives compared among its members only (pure functions, hand-built records)."""

from __future__ import annotations

import dataclasses

from ddpfaults.events import group_key, group_label
from ddpfaults.judge.attribution import attribute
from ddpfaults.judge.flight import collectives, group_identities
from ddpfaults.judge.groups import creation_order, subgroup_timeout_note
from ddpfaults.judge.results import Collective, RankResult, RankState
from ddpfaults.judge.verdict import first_divergence, root_cause


def config(*groups) -> dict:
    """A dump's ``pg_config``: the default group, then ``(name, desc, ranks)`` in the order the rank made them."""
    found = {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2, 3]"}}
    for name, desc, ranks in groups:
        found[name] = {"name": name, "desc": desc, "ranks": str(ranks)}
    return found


def test_a_group_has_one_identity_whatever_its_name_on_each_rank():
    """torch names groups by a per-process counter: the same dp group is '1' on one rank and '3' on another."""
    first = group_identities(config(("1", "dp", [0, 2]), ("3", "tp", [0, 1])))
    other = group_identities(config(("2", "tp", [2, 3]), ("3", "dp", [0, 2])))
    assert first["1"] == other["3"] == ("0,2", [0, 2], "dp")
    assert first["3"][0] == "0,1" and other["2"][0] == "2,3"


def test_groups_of_the_same_members_are_told_apart_by_the_order_they_were_made_in():
    found = group_identities(
        config(("1", "undefined", [0, 1, 2, 3]), ("2", "undefined", [0, 1]), ("5", "x", [3, 2, 1, 0]))
    )
    assert [found[n][0] for n in ("1", "2", "5")] == ["0,1,2,3", "0,1", "0,1,2,3#1"]
    assert group_key([3, 1]) == "1,3" and group_key([1, 3], 2) == "1,3#2"
    assert group_label([1, 0], "mesh_tp") == "process group mesh_tp of ranks 0, 1"
    assert group_label([1, 0], "undefined") == "process group of ranks 0, 1"


def _entry(record_id, name, size):
    return {
        "record_id": record_id,
        "pg_id": int(name),
        "process_group": (name, "whatever"),
        "collective_seq_id": record_id + 1,
        "profiling_name": "gloo:all_reduce",
        "input_sizes": [[size]],
        "frames": [{"filename": "/home/u/train.py", "line": 7, "name": "main"}],
        "time_created_ns": 1,
        "retired": True,
    }


def test_a_recorded_collective_carries_its_groups_identity_and_members():
    dump = {"pg_config": config(("4", "mesh_tp", [2, 3])), "entries": [_entry(0, "4", 4), _entry(1, "0", 2)]}
    found = collectives(dump, since_wall=None, steps=[])
    assert [(c.group, c.members) for c in found] == [("2,3", [2, 3]), (None, None)]
    assert found[0].note == "process group mesh_tp of ranks 2, 3" and found[1].note == ""


def call(seq, group=None, members=None, size=4, step=0) -> Collective:
    return Collective(seq, "all_reduce", [[size]], "train.py:7 in main", step, group=group, members=members)


def rank(r, calls, state=RankState.FINISHED) -> RankResult:
    return RankResult(rank=r, state=state, collectives=calls)


def test_two_tp_pairs_each_run_their_own_sequence():
    """Ranks 0 and 1 all_reduce [4] in their pair, ranks 2 and 3 [8] in theirs: no divergence."""
    pairs = {0: ("0,1", [0, 1], 4), 1: ("0,1", [0, 1], 4), 2: ("2,3", [2, 3], 8), 3: ("2,3", [2, 3], 8)}
    ranks = [rank(r, [call(1, *pairs[r]), call(2)]) for r in range(4)]  # then the default group's all_reduce
    assert first_divergence(ranks) is None
    ranks[3].collectives[1] = call(2, size=5)  # the default group's still compares every rank
    assert first_divergence(ranks).odd_ranks == (3,)


def test_a_divergence_inside_one_group_names_only_its_members():
    """Rank 3 made one tp all_reduce fewer: its pair splits 1 against 1; ranks 0 and 1 agree and are not drawn in."""
    tp = {0: ("0,1", [0, 1]), 1: ("0,1", [0, 1]), 2: ("2,3", [2, 3]), 3: ("2,3", [2, 3])}
    ranks = []
    for r in range(4):
        made = [call(1, *tp[r]), call(2, size=2)]
        if r != 3:
            made.append(call(3, *tp[r], step=1))
        ranks.append(rank(r, made, RankState.BLOCKED if r == 2 else RankState.FINISHED))
    divergence = first_divergence(ranks)
    assert divergence is not None
    assert sorted(r for g in divergence.groups for r in g.ranks) == [2, 3]
    assert divergence.index == 3 and divergence.odd_ranks == ()


def test_the_earliest_of_several_groups_divergences_is_the_first():
    ranks = [
        rank(0, [call(1, "0,1", [0, 1]), call(2, size=1)]),
        rank(1, [call(1, "0,1", [0, 1]), call(2, size=2)]),
    ]
    ranks[1].collectives[0] = call(1, "0,1", [0, 1], size=9)
    divergence = first_divergence(ranks)
    assert divergence.index == 1 and divergence.groups[0].call.group == "0,1"


def test_of_two_divergences_at_one_number_the_one_made_at_the_earlier_step_is_first():
    """Rank 1 skipped its step-1 tp all_reduce (pair 0, 1) and made the default group's step-2 all_reduce as its
    collective #4, where rank 0 waits in that tp call: both groups diverge at #4; the tp group's is the first."""
    tp = {0: ("0,1", [0, 1]), 1: ("0,1", [0, 1]), 2: ("2,3", [2, 3]), 3: ("2,3", [2, 3])}
    ranks = []
    for r in range(4):
        made = [call(1, step=0), call(2, *tp[r], step=0), call(3, step=1)]
        made.append(call(4, step=2) if r == 1 else call(4, *tp[r], step=1))
        if r in (2, 3):
            made.append(call(5, step=2))
        ranks.append(rank(r, made, RankState.BLOCKED))
    divergence = first_divergence(ranks)
    assert divergence.index == 4
    assert {g.call.group for g in divergence.groups if g.call is not None} == {"0,1"}
    assert sorted(r for g in divergence.groups for r in g.ranks) == [0, 1]


def making(r, *groups) -> RankResult:
    """A rank whose events say it began to make ``groups`` (``(members, desc)``) in that order."""
    events = [
        {"k": "enter", "op": "new_group", "members": list(m), "note": d, "seq": i} for i, (m, d) in enumerate(groups)
    ]
    return RankResult(rank=r, state=RankState.BLOCKED, events=events)


DP = [((0, 2), "dp"), ((1, 3), "dp")]
TP = [((0, 1), "tp"), ((2, 3), "tp")]


def test_a_rank_making_its_groups_in_another_order_is_named():
    ranks = [making(r, *(TP + DP if r == 2 else DP + TP)) for r in range(4)]
    found = creation_order(ranks)
    assert found.ranks == (2,)
    assert "rank 2 made process group tp of ranks 0, 1 as its process group #1" in found.shows
    assert "ranks 0, 1, 3 made process group dp of ranks 0, 2: rank 2 created tp before dp" in found.shows


def test_groups_made_in_one_order_or_cut_short_are_no_finding():
    assert creation_order([making(r, *(DP + TP)) for r in range(4)]) is None
    assert creation_order([making(0, *DP), making(1, *(DP + TP))]) is None  # rank 0 stopped after two


def test_groups_each_made_by_exactly_their_members_are_no_finding():
    """``new_group(ranks, use_local_synchronization=True)`` is called by the group's members alone: ranks 0, 1 make
    tp of ranks 0, 1 where ranks 2, 3 make tp of ranks 2, 3, and that is one order, not two."""
    assert creation_order([making(r, TP[r // 2]) for r in range(4)]) is None
    assert creation_order([making(r, TP[r // 2], *DP) for r in range(4)]) is None
    assert creation_order([making(r, TP[r // 2] if r != 3 else TP[0]) for r in range(4)]) is not None  # 3 no member


def test_an_even_split_names_no_one_and_says_why():
    """One order against the other at 2 ranks: each side made, as its group #1, a group the other made later (or
    never): symmetric, a group being made once (no earlier step of a rank's own to depart from)."""
    found = creation_order([making(0, *(DP + TP)), making(1, *(TP + DP))])
    assert found.ranks == ()
    assert found.shows.startswith(
        "as process group #1 rank 0 made process group dp of ranks 0, 2; rank 1 made process group tp of ranks 0, 1: "
        "as many ranks on each side"
    ), found.shows
    assert "so nothing shows which order was meant" in found.shows and "which no other rank made" not in found.shows
    extra = creation_order([making(0, *DP), making(1, ((1,), "extra"), *DP)])
    assert extra.ranks == ()
    assert "rank 1 made process group extra of ranks 1, which no other rank made" in extra.shows, extra.shows
    assert "rank 0 made process group dp of ranks 0, 2;" in extra.shows, extra.shows


WHOLE = [((0, 1, 2, 3), "a"), ((0, 1, 2, 3), "b")]


def crosswise(size: int, swapped: int = 1) -> list[RankResult]:
    """Every rank makes groups a and b of the whole world, ``swapped`` b first, then all_reduces in its a: torch
    names groups by the order each rank made them, so the swapped rank's a is its peers' b (``"0,1,2,3#1"``, the
    second group of those members), and each side waits for the other in a different group."""
    whole = [((tuple(range(size))), d) for _, d in WHOLE]
    key = ",".join(str(r) for r in range(size))
    world = []
    for r in range(size):
        made = making(r, *(whole[::-1] if r == swapped else whole))
        group = f"{key}#1" if r == swapped else key
        world.append(dataclasses.replace(made, collectives=[call(1, group, list(range(size)), size=2)]))
    return world


def test_groups_made_in_another_order_come_before_any_other_evidence_of_the_divergence_they_cause():
    four = crosswise(4)
    judged = attribute(first_divergence(four), four, order=creation_order(four))
    assert judged.odd_ranks == (1,)
    assert "rank 1 created b before a" in judged.basis
    assert "rank 1 never called collective #1" in judged.blame() and "rank 1 created b before a" in judged.blame()
    two = crosswise(2)
    order = creation_order(two)
    judged = attribute(first_divergence(two), two, order=order)
    assert judged.odd_ranks == () and judged.basis == order.shows
    blame = judged.blame()
    assert blame.startswith("ranks 0, 1 disagree at collective #1 and nothing shows which diverged (as process group")
    assert "so nothing shows which order was meant" in blame, blame
    plain = attribute(first_divergence(two), two)  # without the order: no reason given
    assert plain.odd_ranks == () and "(" not in plain.blame().split(":")[0]


def test_symmetric_evidence_is_a_root_cause_naming_no_rank():
    """Ranks waiting in new_group record no collective: the creation order alone is the root cause."""
    two = [making(0, *DP), making(1, ((1,), "extra"), *DP)]
    order = creation_order(two)
    root, text = root_cause(two, None, "stall", deviation=order)
    assert root is None
    assert text == f"nothing shows which rank diverged: {order.shows}"
    four = [making(r, *(((1,), "extra"),) if r == 1 else (), *DP) for r in range(4)]
    assert root_cause(four, None, "stall", deviation=creation_order(four))[0] == 1


def test_a_hang_in_a_subgroup_notes_glooss_30_minute_default():
    assert subgroup_timeout_note({0: call(3), 1: None}) == ""  # the default group takes init_process_group's
    note = subgroup_timeout_note({0: call(3), 2: call(4, "2,3", [2, 3]), 3: call(4, "2,3", [2, 3])})
    assert note.startswith("; ranks 2, 3 wait in a process group made by new_group or init_device_mesh")
    assert "gloo's 30-minute default unless the group is made with timeout=" in note
    making = Collective(5, "new_group", [], "train.py:3 in main", None)
    assert subgroup_timeout_note({1: making}).startswith("; rank 1 waits in")
