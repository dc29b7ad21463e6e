"""Point-to-point messages matched pair by pair, and all_to_all_single's split sizes matched rank by rank (pure
functions over hand-built enter events)."""

from __future__ import annotations

from ddpfaults.judge.deadlock import P2P, Op, Stand, Standing, prove
from ddpfaults.judge.p2p import begun, own_traffic, p2p_finding, split_finding
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


def gpipe(world, short_step=None, micro=4, steps=4, setup=False):
    """A GPipe-ordered pipeline (every microbatch forward, then every one backward) at its hang: stage 0's batch at
    ``short_step`` holds one microbatch fewer, so it sends one activation fewer and waits for its first gradient,
    while every other stage forwards what it got and waits for the activation never sent. ``setup``: step 0 begins
    with an exchange of shapes between each pair of stages (as torch.distributed.pipelining's first step does)."""

    def forward(r, step, n):
        for _ in range(n):
            yield from ([enter("recv", r - 1, step)] if r > 0 else [])
            yield from ([enter("send", r + 1, step)] if r < world - 1 else [])

    def backward(r, step, n):
        for _ in range(n):
            yield from ([enter("recv", r + 1, step)] if r < world - 1 else [])
            yield from ([enter("send", r - 1, step)] if r > 0 else [])

    ranks = []
    for r in range(world):
        events = []
        if setup:
            events += [enter("send", r + 1, 0, 1)] if r < world - 1 else []
            events += [enter("recv", r - 1, 0, 1)] if r > 0 else []
        for step in range(steps if short_step is None else short_step):
            events += [*forward(r, step, micro), *backward(r, step, micro)]
        if short_step is not None:
            events += forward(r, short_step, micro - 1)
            events.append(enter("recv", 1, short_step) if r == 0 else enter("recv", r - 1, short_step))
        ranks.append(rank(r, events, RankState.FINISHED if short_step is None else RankState.BLOCKED))
    return ranks


def test_a_stage_one_microbatch_short_is_named_by_its_own_earlier_steps():
    """Each stage is short on one pair (stage 0 sent one activation fewer; stage 1 sent no gradient back while it
    waits for it): the pair counts alone name no one. Stage 0's own steps do: it made 3 sends, then a receive,
    where its other steps made 4 sends first; every other stage made, so far, what its steps begin with."""
    for world in (2, 4):
        ranks = gpipe(world, short_step=2)
        found = p2p_finding(ranks)
        assert found is not None and found.ranks == (0,), found
        assert found.shows.startswith(
            "in step 2 rank 0 made 3 send(s) to rank 1, then 1 recv(s) from rank 1 so far, where its other steps "
            "made 4 send(s) to rank 1, then 4 recv(s) from rank 1;"
        ), found.shows
        others = "rank 1 made its usual ones" if world == 2 else "ranks 1-3 made their usual ones"
        assert found.shows.endswith(others), found.shows
    assert p2p_finding(gpipe(2)) is None and own_traffic(gpipe(4)) is None  # a completed pipeline


def test_own_traffic_needs_two_earlier_steps_alike():
    """Short at step 1: one earlier step is no habit; at step 2 of a rank whose earlier steps differ, no usual."""
    assert own_traffic(gpipe(2, short_step=1)) is None
    ranks = gpipe(2, short_step=2)
    ranks[0].events = [e for e in ranks[0].events if not (e["step"] == 0 and e["op"] == "recv")]
    assert own_traffic(ranks) is None


def test_a_first_step_unlike_the_later_ones_is_set_up():
    """A first step that also exchanged shapes is left out of the habit when the later complete steps agree."""
    found = own_traffic(gpipe(2, short_step=3, setup=True))
    assert found is not None and found.ranks == (0,) and found.shows.startswith("in step 3 rank 0 made 3 send(s)")
    assert own_traffic(gpipe(2, short_step=2, setup=True)) is None  # one step after the set-up is no habit


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


def end(r, sent=None, received=None, at=None):
    """Rank ``r`` finished (its process open) after the given sends and receives, by peer."""
    return Standing(r, Stand.ENDED, 0, why="finished", at=at, sent=sent or {}, received=received or {})


def wait(r, kind, peer, sent=None, received=None, at=None):
    """Rank ``r``'s main thread in a blocking ``kind`` (send or recv) with ``peer``: its n-th with that peer, n
    counted from the sends (receives) it has begun, this one included."""
    sent, received = sent or {}, received or {}
    n = (sent if kind == "send" else received)[peer]
    op = Op(n, kind, peer, P2P)
    return Standing(r, Stand.WAITING, 0, (op,), at=at, sent=sent, received=received)


def test_a_stage_waiting_for_a_microbatch_its_finished_sender_never_sent_is_proved_stuck():
    """Four stages; stage 1 finished after 7 sends to stage 2, which waits in its 8th recv; stage 3 waits on stage 2:
    the one wait-for graph (deadlock.prove) proves it from the pairs' counts."""
    standings = [
        end(0, sent={1: 8}, at=1.0),
        end(1, sent={2: 7}, received={0: 8}, at=1.1),
        wait(2, "recv", 1, sent={3: 7}, received={1: 8}, at=1.2),
        wait(3, "recv", 2, received={2: 8}, at=1.3),
    ]
    proof = prove(standings)
    assert [(s.rank, s.peer) for s in proof.stuck] == [(2, 1), (3, 2)]
    assert proof.formed == 1.3
    text = proof.describe()
    assert text.startswith("ranks 0, 1 finished; "), text
    assert (
        "rank 2 waits in its recv #8 from rank 1, which rank 1 never sends (it finished after 7 send(s) to rank 2)"
        in (text)
    )
    assert (
        "rank 3 waits in its recv #8 from rank 2, which rank 2 never sends (it is stuck in its recv #8 from rank 1)"
        in text
    )


def test_a_sender_whose_receiver_finished_is_proved_stuck_in_its_send():
    proof = prove([wait(0, "send", 1, sent={1: 3}), end(1, received={0: 2})])
    assert proof.stuck[0].op.family == "send" and "it finished after 2 receive(s) from rank 0" in proof.describe()


def test_a_send_and_its_receive_in_flight_prove_nothing():
    """Rank 0 in its 3rd send to rank 1, rank 1 in its 3rd recv from rank 0: they meet."""
    assert prove([wait(0, "send", 1, sent={1: 3}), wait(1, "recv", 0, received={0: 3})]) is None


def test_two_ranks_sending_to_each_other_first_are_a_cycle():
    """Each waits in a blocking send the other would receive only after its own send: neither can leave."""
    standings = [wait(0, "send", 1, sent={1: 1}), wait(1, "send", 0, sent={0: 1})]
    proof = prove(standings)
    assert [s.rank for s in proof.stuck] == [0, 1]
    assert (
        "rank 0 waits in its send #1 to rank 1, which rank 1 never receives (it is stuck in its send #1 to rank 0)"
        in (proof.describe())
    )
    standings[1] = wait(1, "recv", 0, received={0: 1})  # rank 1 receives first: they meet
    assert prove(standings) is None
    both = [rank(r, [enter("send", 1 - r, None)], RankState.BLOCKED) for r in (0, 1)]
    assert p2p_finding(both) is None  # symmetric: neither is named


def test_a_rank_standing_elsewhere_proves_nothing():
    standings = [end(0, sent={1: 1}), wait(1, "recv", 0, received={0: 2}), Standing(2, Stand.FREE)]
    assert prove(standings) is None
    assert begun([enter("send", 1, 0), enter("isend", 1, 0), enter("recv", 2, 0), {"k": "exit"}]) == ({1: 2}, {2: 1})


def test_a_receiver_expecting_an_even_split_is_checked_from_the_senders_side():
    """The receivers pass no output_split_sizes (torch splits evenly: 4 rows from each of 2 ranks); rank 0 routes
    6 rows to rank 1 where rank 1 expects 4, with a sender's splits given: the sender is named."""

    def call(rank, splits, shapes, state=RankState.FINISHED):
        enter = {"k": "enter", "op": "all_to_all_single", "step": 0, "site": "moe.py:9 in route", "shapes": shapes}
        return RankResult(rank=rank, state=state, events=[{**enter, "splits": splits}] if splits else [enter])

    ranks = [call(0, [[2, 6], None], [[8, 4], [8, 4]], RankState.RAISED), call(1, None, [[8, 4], [8, 4]])]
    found = split_finding(ranks)
    assert found.ranks == (0,) and "sent rank 1 6 row(s) where rank 1 expected 4 from it" in found.shows
    even = [call(0, None, [[8, 4], [8, 4]]), call(1, None, [[8, 4], [8, 4]])]
    assert split_finding(even) is None
