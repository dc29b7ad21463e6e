"""The deadlock proof (ddpfaults.judge.deadlock) as a pure function over standings: what it proves, and every way a
world that may still move is left to the stall rule."""

from __future__ import annotations

from ddpfaults.judge.deadlock import P2P, Op, Stand, Standing, family, needed_peers, prove, record, records

ENDED, WAITING, FREE = Stand.ENDED, Stand.WAITING, Stand.FREE


def ended(rank, issued, why="finished", at=1.0, ops=None):
    return Standing(rank, ENDED, issued, ops=ops or {}, why=why, at=at)


LAST = object()  # a waiting rank's count: the last collective it waits in


def waiting(rank, *waits, issued=LAST, ops=None, at=1.0):
    issued = max(op.number for op in waits) if issued is LAST else issued
    ops = {op.number: op for op in waits} if ops is None else ops
    return Standing(rank, WAITING, issued, tuple(waits), ops, at=at)


def all_reduce(number):
    return Op(number, "all_reduce")


def test_a_rank_that_finished_one_collective_short_leaves_the_others_stuck_for_good():
    # SkippedCollective(rank=2, step=3) in a 4-rank all_reduce loop: rank 2 finished after 7, the others wait in #8
    standings = [waiting(0, all_reduce(8)), waiting(1, all_reduce(8)), ended(2, 7, at=2.5), waiting(3, all_reduce(8))]
    proof = prove(standings)
    assert proof is not None
    assert [(s.rank, s.op.number, s.peer) for s in proof.stuck] == [(0, 8, 2), (1, 8, 2), (3, 8, 2)]
    assert proof.ended == ((2, "finished"),) and proof.formed == 2.5
    assert proof.describe() == (
        "rank 2 finished; ranks 0, 1, 3 wait in collective #8 (all_reduce), which rank 2 never makes "
        "(it finished after its collective #7)"
    )


def test_a_warm_worlds_proof_numbers_collectives_from_the_jobs_first():
    # the group made 50 collectives in earlier jobs: #58 is this job's #8, as its divergence numbers it
    proof = prove([waiting(0, all_reduce(58)), ended(1, 57), waiting(2, Op(58, "barrier"))])
    assert proof.describe(before=50) == (
        "rank 1 finished; rank 0 waits in collective #8 (all_reduce), which rank 1 never makes (it finished after its "
        "collective #7); rank 2 waits in collective #8 (barrier), which rank 1 never makes (it finished after its "
        "collective #7)"
    )
    assert (
        prove([waiting(0, all_reduce(51)), ended(1, 50)])
        .describe(before=50)
        .endswith("(it finished before making any)")
    )


def test_ranks_inside_the_same_collective_are_never_proved_stuck():
    # two ranks in the same all_reduce (about to complete), and a healthy DDP job's ranks in the same bucket
    assert prove([waiting(0, all_reduce(8)), waiting(1, all_reduce(8))]) is None
    buckets = [waiting(r, all_reduce(5), all_reduce(6), issued=6) for r in range(4)]
    assert prove(buckets) is None
    # a peer that finished having made the collective the others wait in may be about to complete it with them
    assert prove([waiting(0, all_reduce(8)), ended(1, 8)]) is None
    # the same collective with other sizes (a mismatch gloo may abort a rank for, or let pass): not a proof
    assert prove([waiting(0, all_reduce(9)), waiting(1, all_reduce(9)), waiting(2, all_reduce(9))]) is None


def test_any_rank_that_may_still_act_leaves_the_world_unproved():
    stuck = [waiting(0, all_reduce(8)), ended(2, 7)]
    assert prove([*stuck, Standing(1, FREE)]) is None  # running, starting, gone, or waiting on something unknown
    assert prove([waiting(0, all_reduce(8)), ended(1, None)]) is None  # ended, its count unknown (no flight record)
    assert prove([ended(0, 7), ended(1, 7)]) is None  # nobody waits: the world ends by itself
    assert prove([waiting(0, Op(8, None)), ended(1, 7)]) is None  # a wait of unknown kind needs nobody known
    assert prove([waiting(0, all_reduce(8), issued=None), ended(1, 7)]) is None  # its own count unknown


def test_a_collective_of_another_kind_with_the_same_number_is_never_met():
    # rank 0 in barrier #8 while ranks 1 and 2 are in all_reduce #8: gloo matches them on different slots
    standings = [waiting(0, Op(8, "barrier")), waiting(1, all_reduce(8)), waiting(2, all_reduce(8))]
    proof = prove(standings)
    assert proof is not None and [(s.rank, s.peer) for s in proof.stuck] == [(0, 1), (1, 0), (2, 0)]
    assert "its collective #8 is barrier" in proof.describe()
    # the kind of a peer's collective counts even when that peer has moved on: it read another slot
    assert prove([waiting(0, Op(8, "barrier")), waiting(1, all_reduce(9), ops={8: all_reduce(8)})]) is not None


def test_broadcast_and_gather_need_only_the_ranks_that_send_to_them():
    # rank 0 (the root) finished after 4; ranks 1 and 2 wait for its broadcast #5
    assert prove([ended(0, 4), waiting(1, Op(5, "broadcast", root=0)), waiting(2, Op(5, "broadcast", root=0))])
    # the root of a broadcast only sends: its peers' absence proves nothing about it (its algorithm may not need them)
    assert prove([waiting(0, Op(5, "broadcast", root=0)), ended(1, 4)]) is None
    # a broadcast whose root is unknown needs nobody known
    assert prove([ended(0, 4), waiting(1, Op(5, "broadcast"))]) is None
    # gather: the root needs every rank, the others only send
    assert prove([waiting(0, Op(5, "gather", root=0)), ended(1, 4)]) is not None
    assert prove([waiting(0, Op(5, "gather", root=1)), ended(1, 4)]) is None
    assert needed_peers(Op(5, "all_gather"), 1, 3) == [0, 2]
    assert needed_peers(Op(5, "scatter", root=2), 0, 3) == [2]
    assert needed_peers(Op(5, "scatter", root=7), 0, 3) == []  # not a rank of this world


def test_a_rank_proved_stuck_proves_its_peers_stuck_in_turn():
    # rank 2 finished after 5; rank 0 is stuck in all_reduce #6; rank 1 waits for rank 0's broadcast #7, which rank 0,
    # stuck at #6, never makes. Rank 1 is listed first: the proof goes round until nothing changes.
    standings = [waiting(0, all_reduce(6)), waiting(1, Op(7, "broadcast", root=0)), ended(2, 5)]
    proof = prove(standings)
    assert proof is not None
    assert {s.rank: (s.peer, s.because()) for s in proof.stuck} == {
        0: (2, "it finished after its collective #5"),
        1: (0, "it is stuck in collective #6 (all_reduce)"),
    }


def test_ranks_waiting_to_join_a_group_a_peer_never_joins():
    # rank 1 raised before init_process_group and lingers; ranks 0 and 2 wait in the rendezvous (collective 0)
    rendezvous = Op(0, "init_process_group")
    standings = [waiting(0, rendezvous, issued=-1), ended(1, -1, why="raised and lingers"), waiting(2, rendezvous)]
    proof = prove(standings)
    assert proof is not None
    assert proof.describe() == (
        "rank 1 raised and lingers; ranks 0, 2 wait in the process group's rendezvous (init_process_group), which "
        "rank 1 never makes (it raised and lingers without joining the process group)"
    )
    # every rank in the rendezvous: it may be about to complete
    assert prove([waiting(r, rendezvous, issued=-1) for r in range(3)]) is None


def test_a_finalize_waiting_for_several_buckets_is_stuck_if_any_of_them_is():
    # DDP's finalize waits for buckets #7 and #8; rank 1 finished after 7: #7 may complete, #8 never does
    assert prove([waiting(0, all_reduce(7), all_reduce(8)), ended(1, 7)]) is not None
    assert prove([waiting(0, all_reduce(7), all_reduce(8)), ended(1, 8)]) is None


def test_the_formation_time_is_the_last_stand_taken():
    standings = [waiting(0, all_reduce(8), at=2.0), ended(1, 7, at=3.5)]
    assert prove(standings).formed == 3.5
    undated = [waiting(0, all_reduce(8), at=None), ended(1, 7)]
    assert prove(undated).formed is None


def test_the_families_of_torch_calls_and_flight_records():
    assert family("all_reduce") == family("gloo:all_reduce") == family("all_reduce_coalesced") == "all_reduce"
    assert family("all_gather_into_tensor") == family("gloo:all_gather") == "all_gather"
    assert family("gloo:sparse_all_reduce") is None and family("all_gather_object") is None and family(None) is None


def test_a_flight_record_gives_the_default_groups_count_and_kinds():
    dump = {
        "pg_status": {"0": {"last_enqueued_collective": 8}, "1": {"last_enqueued_collective": 3}},
        "entries": [
            {"pg_id": 0, "collective_seq_id": 7, "profiling_name": "gloo:broadcast", "thread_id": "11"},
            {"pg_id": 1, "collective_seq_id": 3, "profiling_name": "gloo:all_reduce", "thread_id": "11"},
            {"pg_id": 0, "collective_seq_id": 8, "profiling_name": "gloo:all_reduce", "thread_id": "12"},
        ],
    }
    found = record(dump)
    assert found.issued == 8
    assert found.ops == {7: Op(7, "broadcast"), 8: all_reduce(8)}
    assert found.threads == {7: "11", 8: "12"}
    assert record(None) is None and record({}) is None
    assert record({"pg_status": {}, "entries": []}).issued is None


TP = {0: ("0,1", (0, 1)), 1: ("0,1", (0, 1)), 2: ("2,3", (2, 3)), 3: ("2,3", (2, 3))}
DP = {0: ("0,2", (0, 2)), 1: ("1,3", (1, 3)), 2: ("0,2", (0, 2)), 3: ("1,3", (1, 3))}


def in_group(rank, layout, number, kind, desc):
    key, members = layout[rank]
    return Op(number, kind, group=key, members=members, desc=desc)


def waiting_in(rank, op, counts, issued=4, **more):
    return Standing(rank, WAITING, issued, (op,), {}, at=1.0, counts=counts, **more)


def test_ranks_each_waiting_on_a_peer_stuck_in_another_group_are_stuck_for_good():
    # 2x2 mesh, every rank made tp #1 and dp #1; at #2 ranks 0 and 3 entered tp first, ranks 1 and 2 dp first:
    # 0 waits (tp) for 1, 1 (dp) for 3, 3 (tp) for 2, 2 (dp) for 0: a cycle across groups, nobody ended
    tp = {r: in_group(r, TP, 2, "all_reduce", "tp") for r in range(4)}
    dp = {r: in_group(r, DP, 2, "barrier", "dp") for r in range(4)}
    standings = [
        waiting_in(0, tp[0], {"0,1": 2, "0,2": 1}),
        waiting_in(1, dp[1], {"0,1": 1, "1,3": 2}),
        waiting_in(2, dp[2], {"2,3": 1, "0,2": 2}),
        waiting_in(3, tp[3], {"2,3": 2, "1,3": 1}),
    ]
    proof = prove(standings)
    assert proof is not None
    assert [(s.rank, s.peer) for s in proof.stuck] == [(0, 1), (1, 3), (2, 0), (3, 2)]
    assert proof.describe().startswith(
        "rank 0 waits in collective #2 (all_reduce) of process group tp of ranks 0, 1, which rank 1 never makes (it "
        "is stuck in collective #2 (barrier) of process group dp of ranks 1, 3); rank 1 waits in collective #2 "
        "(barrier) of process group dp of ranks 1, 3, which rank 3 never makes (it is stuck in collective #2 "
        "(all_reduce) of process group tp of ranks 2, 3)"
    )


def test_a_rank_that_may_still_reach_the_collective_a_peer_waits_in_breaks_the_cycle():
    tp = {r: in_group(r, TP, 2, "all_reduce", "tp") for r in range(4)}
    dp = {r: in_group(r, DP, 2, "barrier", "dp") for r in range(4)}
    # rank 3 made its dp barrier #2 before entering tp #2: rank 1's barrier completes, so rank 1 reaches tp #2
    cycle = [
        waiting_in(0, tp[0], {"0,1": 2, "0,2": 1}),
        waiting_in(1, dp[1], {"0,1": 1, "1,3": 2}),
        waiting_in(2, dp[2], {"2,3": 1, "0,2": 2}),
        waiting_in(3, tp[3], {"2,3": 2, "1,3": 2}),
    ]
    assert prove(cycle) is None
    # the two pairs of one tp group both in it: it completes (nothing proved of the dp pairs either)
    same = [waiting_in(r, tp[r], {TP[r][0]: 2, DP[r][0]: 1}) for r in range(4)]
    assert prove(same) is None
    # a member whose count in a group is unknown (a record that cannot name every group) is no witness
    unknown = [*cycle[:3], waiting_in(3, tp[3], None)]
    assert prove(unknown) is None
    # a rank that may still act anywhere leaves the world unproved, whatever the cycle of the others
    assert prove([*cycle[:3], Standing(3, FREE)]) is None


def test_a_subgroup_member_that_ended_short_leaves_its_group_stuck_but_no_other():
    # tp pair 2, 3: rank 3 finished after tp #4 while rank 2 waits in tp #5; the other pair ended even
    tp5 = in_group(2, TP, 5, "all_reduce", "tp")
    standings = [
        Standing(0, ENDED, 10, why="finished", counts={"0,1": 5}),
        Standing(1, ENDED, 10, why="finished", counts={"0,1": 5}),
        waiting_in(2, tp5, {"2,3": 5}, issued=10),
        Standing(3, ENDED, 10, why="finished", counts={"2,3": 4}),
    ]
    proof = prove(standings)
    assert proof is not None and [(s.rank, s.peer) for s in proof.stuck] == [(2, 3)]
    assert "(it finished after its collective #4 of process group tp of ranks 2, 3)" in proof.describe()
    assert needed_peers(tp5, 2, 4) == [3]
    assert needed_peers(Op(5, "broadcast", root=2, group="2,3", members=(2, 3)), 3, 4) == [2]
    assert needed_peers(Op(5, "all_reduce", group="name 7"), 0, 4) == []  # a group whose members are unknown


def test_a_barrier_against_an_all_reduce_in_a_subgroup_is_never_met():
    barrier = in_group(1, TP, 3, "barrier", "tp")
    reduce = in_group(0, TP, 3, "all_reduce", "tp")
    standings = [
        waiting_in(0, reduce, {"0,1": 3}, group_ops={"0,1": {3: reduce}}),
        waiting_in(1, barrier, {"0,1": 3}, group_ops={"0,1": {3: barrier}}),
    ]
    proof = prove(standings)
    assert proof is not None
    assert "which rank 1 never makes (its collective #3 is barrier)" in proof.describe()


def test_a_send_or_receive_and_a_collective_make_one_graph():
    # rank 0 receives from rank 1 before the world's barrier #3; rank 1 entered the barrier before sending
    recv = Op(1, "recv", root=1, group=P2P)
    standings = [
        Standing(0, WAITING, 2, (recv,), {}, at=1.0, received={1: 1}),
        Standing(1, WAITING, 3, (Op(3, "barrier"),), {}, at=1.0),
    ]
    proof = prove(standings)
    assert proof is not None
    assert proof.describe() == (
        "rank 0 waits in its recv #1 from rank 1, which rank 1 never sends (it is stuck in collective #3 (barrier)); "
        "rank 1 waits in collective #3 (barrier), which rank 0 never makes (it is stuck in its recv #1 from rank 1)"
    )
    # rank 1 began the send before the barrier: the receive completes, and rank 0 may still reach the barrier
    assert prove([standings[0], Standing(1, WAITING, 3, (Op(3, "barrier"),), {}, sent={0: 1})]) is None
    # a rank in its send #2 to a peer that finished after one receive from it
    send = Op(2, "send", root=1, group=P2P)
    proof = prove(
        [Standing(0, WAITING, 0, (send,), {}, sent={1: 2}), Standing(1, ENDED, 0, why="finished", received={0: 1})]
    )
    assert proof.describe() == (
        "rank 1 finished; rank 0 waits in its send #2 to rank 1, which rank 1 never receives (it finished after 1 "
        "receive(s) from rank 0)"
    )


def test_a_flight_record_gives_each_groups_count_and_kinds_by_its_identity():
    dump = {
        "pg_config": {"0": {"desc": "default_pg", "ranks": "[0, 1, 2, 3]"}, "4": {"desc": "tp", "ranks": "[2, 3]"}},
        "pg_status": {"0": {"last_enqueued_collective": 8}, "1": {"last_enqueued_collective": 3}},
        "entries": [
            {"pg_id": 0, "collective_seq_id": 8, "profiling_name": "gloo:all_reduce", "thread_id": "11"},
            {
                "pg_id": 1,
                "process_group": ("4", "tp"),
                "collective_seq_id": 3,
                "profiling_name": "gloo:barrier",
                "thread_id": "11",
            },
        ],
    }
    found = records(dump)
    assert found[None].issued == 8 and found["2,3"].issued == 3
    assert found["2,3"].ops == {3: Op(3, "barrier", group="2,3", members=(2, 3))}
    assert found["2,3"].ops[3].desc == "tp"
    # a group counted in the status that no entry names: its count cannot be placed, so no group's is trusted
    unnamed = dict(dump, pg_status={**dump["pg_status"], "2": {"last_enqueued_collective": 5}})
    assert records(unnamed) is None and record(unnamed).issued == 8
