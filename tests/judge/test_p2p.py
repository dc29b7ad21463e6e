"""Point-to-point messages matched pair by pair, and all_to_all_single's split sizes matched rank by rank (pure
functions over hand-built enter events)."""

from __future__ import annotations

from ddpfaults.judge.p2p import p2p_finding, split_finding
from ddpfaults.judge.results import RankResult, RankState


def enter(op, peer, step, size=8, site="pipe.py:14 in stage"):
    return {"k": "enter", "op": op, "root": peer, "step": step, "shapes": [[size]], "site": site}


def rank(r, events, state=RankState.FINISHED):
    return RankResult(rank=r, state=state, events=events)


def pipeline(short=None, big=None, micro=2, steps=2, world=3):
    """Stage r receives ``micro`` messages from r-1 and sends them to r+1 each step; ``short`` sends one fewer in
    step 1, ``big`` sends twice the size."""
    ranks = []
    for r in range(world):
        events = []
        for step in range(steps):
            for m in range(micro):
                if r > 0:
                    events.append(enter("recv", r - 1, step))
                if r < world - 1 and not (r == short and step == 1 and m == micro - 1):
                    events.append(enter("send", r + 1, step, 16 if r == big else 8))
        ranks.append(rank(r, events))
    return ranks


def test_matching_pipelines_are_no_finding():
    assert p2p_finding(pipeline()) is None


def test_the_stage_that_sent_one_fewer_is_named_not_the_stage_waiting_downstream():
    """Rank 1 sent one fewer to rank 2, so rank 2 (blocked in its recv) sent one fewer to rank 3 as well."""
    ranks = pipeline(short=1, world=4)
    ranks[3].state = ranks[2].state = RankState.BLOCKED
    found = p2p_finding(ranks)
    assert found.ranks == (1,)
    assert found.shows.startswith("rank 1 sent 1 message(s) to rank 2 in step 1, where rank 2 received 2")
    assert "recv([8]) from rank 1 at pipe.py:14 in stage (step 1) is never sent" in found.shows


def test_a_receiver_taking_one_fewer_is_named_when_its_sender_waits_in_send():
    ranks = pipeline(world=2)
    ranks[1].events.pop()  # rank 1 never receives the last message; rank 0 waits in its send
    ranks[0].state = RankState.BLOCKED
    found = p2p_finding(ranks)
    assert found.ranks == (1,) and "rank 1 received 1 message(s) from rank 0 in step 1, where rank 0 sent 2" in (
        found.shows
    )


def test_a_larger_message_than_the_receivers_buffer_names_the_sender():
    found = p2p_finding(pipeline(big=0, world=2))
    assert found.ranks == (0,)
    assert "rank 0 made send([16]) to rank 1" in found.shows and "recv([8]) from rank 0" in found.shows


def a2a(r, splits, state=RankState.FINISHED):
    event = {"k": "enter", "op": "all_to_all_single", "splits": splits, "step": 0, "site": "moe.py:9 in route"}
    return rank(r, [event], state)


def test_split_sizes_the_ranks_agree_on_are_no_finding():
    assert split_finding([a2a(0, [[1, 3], [1, 2]]), a2a(1, [[2, 0], [3, 0]])]) is None


def test_the_sender_of_more_rows_than_the_receiver_expected_is_named():
    """Rank 0 routes 4 rows to rank 1, which expects 1 (its own count): gloo aborts rank 1."""
    ranks = [a2a(0, [[0, 4], [0, 1]], RankState.RAISED), a2a(1, [[1, 1], [0, 1]], RankState.DIED)]
    found = split_finding(ranks)
    assert found.ranks == (0,)
    assert "rank 0's all_to_all_single at moe.py:9 in route (step 0) sent rank 1 4 row(s) where rank 1 expected" in (
        found.shows
    )
