"""Unit tests of ddpfaults.judge.attribution: which ranks diverged, from what each did (hand-built results)."""

from __future__ import annotations

import dataclasses

from ddpfaults.judge.attribution import attribute, culprits, loop_exit, own_pattern
from ddpfaults.judge.results import Collective, FiredFault, RankResult, RankState
from ddpfaults.judge.verdict import first_divergence, root_cause

BUCKET = {"op": "all_reduce", "shapes": [[9]], "site": "train.py:43 in main", "note": "DDP gradient bucket"}


def bucket(batch: int, step: int | None = None) -> Collective:
    return Collective(seq=0, step=step, batch=batch, **BUCKET)


def barrier(batch: int) -> Collective:
    return Collective(seq=0, op="barrier", shapes=[], site="train.py:45 in main", step=None, batch=batch)


def batches(n: int, it: int = 1, ended: bool = False) -> list[dict]:
    events = [{"k": "batch", "index": i, "it": it, "n": i} for i in range(n)]
    return events + ([{"k": "loader_end", "it": it, "yielded": n}] if ended else [])


def rank(r, state, calls, events=(), **kw) -> RankResult:
    numbered = [dataclasses.replace(c, seq=n) for n, c in enumerate(calls, 1)]  # #N is the rank's N-th, as judged
    return RankResult(rank=r, state=state, collectives=numbered, events=list(events), **kw)


def skipped_batch_world(size: int, skipper: int = 1) -> list[RankResult]:
    """Every rank trains 5 batches and meets at a closing barrier; ``skipper`` ``continue``d past batch 1, so its
    gradient all_reduces paired with its peers' next ones and it reached the barrier one all_reduce early."""
    world = []
    for r in range(size):
        if r == skipper:
            world.append(rank(r, RankState.BLOCKED, [bucket(b) for b in (0, 2, 3, 4)] + [barrier(4)], batches(5)))
        else:
            world.append(rank(r, RankState.BLOCKED, [bucket(b) for b in range(5)], batches(5)))
    return world


def test_one_against_one_names_the_rank_whose_own_loop_changed():
    world = skipped_batch_world(2)
    vote = first_divergence(world)
    assert vote is not None and vote.odd_ranks == ()  # one against one: no vote
    judged = attribute(vote, world)
    assert judged.odd_ranks == (1,)
    assert "in DataLoader batch 1 rank 1 made no collective" in judged.basis
    assert root_cause(world, judged, "stall")[0] == 1


def test_the_rank_whose_loop_changed_is_named_against_any_majority():
    # 3 of 4 ranks skipped batch 1 (their data was empty): the vote names rank 0, what each did names ranks 1-3
    world = [
        rank(r, RankState.BLOCKED, [bucket(b) for b in (0, 2, 3, 4)] + [barrier(4)], batches(5)) for r in (1, 2, 3)
    ]
    world.insert(0, rank(0, RankState.BLOCKED, [bucket(b) for b in range(5)], batches(5)))
    assert first_divergence(world).odd_ranks == (0,)
    assert attribute(first_divergence(world), world).odd_ranks == (1, 2, 3)


def test_a_call_every_rank_makes_once_is_not_a_change_of_pattern():
    # DDP rebuilds its buckets in its second forward (a broadcast): rank 0 there at batch 1, the skipper at batch 2
    rebuild = {"op": "broadcast", "shapes": [[3]], "site": "", "note": "DDP forward broadcast", "step": None}
    world = skipped_batch_world(2)
    world[0].collectives.insert(1, Collective(seq=0, batch=1, **rebuild))
    world[1].collectives.insert(1, Collective(seq=0, batch=2, **rebuild))
    assert attribute(first_divergence(world), world).odd_ranks == (1,)


def test_a_rank_whose_loader_ran_out_first_left_its_loop_early():
    short = rank(1, RankState.BLOCKED, [bucket(b) for b in range(3)] + [barrier(2)], batches(3, ended=True))
    world = [rank(0, RankState.BLOCKED, [bucket(b) for b in range(4)], batches(4)), short]
    evidence = loop_exit(world)
    assert evidence is not None and evidence.ranks == (1,)
    assert (
        evidence.shows
        == "rank 1 left its loop early: its DataLoader iterator ran out after 3 batches, where rank 0 drew 4"
    )
    assert attribute(first_divergence(world), world).odd_ranks == (1,)


def test_loaders_that_ran_out_together_show_nothing():
    world = [rank(r, RankState.FINISHED, [bucket(b) for b in range(3)], batches(3, ended=True)) for r in range(2)]
    assert loop_exit(world) is None and own_pattern(world) is None


def test_a_fault_on_one_side_only_names_that_side():
    # both ranks blocked in their first unit: no history to compare with; a fault fired on rank 1 alone
    world = [
        rank(0, RankState.BLOCKED, [Collective(1, "all_reduce", [[1]], "t.py:3 in f", 0)]),
        rank(1, RankState.BLOCKED, [Collective(1, "barrier", [], "t.py:5 in f", 0)]),
    ]
    fired = [FiredFault(0, "RankOnlyBarrier(rank=1, step=0)", 1, 0, "on_step")]
    judged = attribute(first_divergence(world), world, fired)
    assert judged.odd_ranks == (1,) and "a fault fired on rank 1 only: RankOnlyBarrier(rank=1, step=0)" in judged.basis


def test_a_loop_without_one_usual_unit_shows_nothing():
    # gradient accumulation: every rank syncs every other step, so no rank has one usual step to depart from
    def ar(step):
        return Collective(0, "all_reduce", [[4]], "t.py:9 in f", step)

    world = [rank(r, RankState.BLOCKED, [ar(s) for s in (1, 3)], last_step=3) for r in (0, 2, 3)]
    world.insert(1, rank(1, RankState.FINISHED, [ar(2)], last_step=3))
    assert own_pattern(world) is None


def test_without_evidence_no_rank_is_named():
    world = [
        rank(0, RankState.BLOCKED, [Collective(1, "all_reduce", [[1]], "t.py:3 in f", 0)]),
        rank(1, RankState.BLOCKED, [Collective(1, "barrier", [], "t.py:5 in f", 0)]),
    ]
    judged = attribute(first_divergence(world), world)
    assert judged.odd_ranks == ()
    root, text = root_cause(world, judged, "stall")
    assert root is None
    assert text.startswith("ranks 0, 1 disagree at collective #1 and nothing shows which diverged: rank 0 called")


def test_step_units_where_no_batch_was_drawn():
    # a ctx.step loop: rank 2 skipped step 1's all_reduce and finished one early; the others wait in step 3's
    def ar(step):
        return Collective(0, "all_reduce", [[4]], "t.py:9 in f", step)

    world = [rank(r, RankState.BLOCKED, [ar(s) for s in range(4)], last_step=3) for r in (0, 1)]
    world.append(rank(2, RankState.FINISHED, [ar(s) for s in (0, 2, 3)], last_step=3))
    assert own_pattern([rank(r.rank, r.state, r.collectives[:2], last_step=1) for r in world]) is None  # no habit yet
    evidence = own_pattern(world)
    assert evidence is not None and evidence.ranks == (2,)
    assert evidence.shows.startswith("in step 1 rank 2 made no collective, where its other steps made all_reduce([4])")


def test_a_gloo_abort_blames_the_rank_whose_own_loop_changed_not_the_receiver():
    # rank 1 skipped the criterion's all_reduce in batch 2: its bucket met rank 0's criterion all_reduce and gloo
    # aborted rank 0 (the receiver, no record of its own but ddpfaults' tracing); rank 1 saw "Connection reset"
    count = {"op": "all_reduce", "shapes": [[1]], "site": "loss.py:3 in criterion", "step": None}
    receiver = rank(
        0,
        RankState.DIED,
        [Collective(0, batch=b, **count) for b in (0, 1, 2)],
        batches(3),
        error="was killed by SIGABRT: ... Is there a distributed collective mismatch in your code?",
        failed_at=1.0,
    )
    sender = rank(
        1,
        RankState.RAISED,
        [Collective(0, batch=0, **count), bucket(0), Collective(0, batch=1, **count), bucket(1), bucket(2)],
        batches(3),
        error="RuntimeError: Connection reset by peer",
        collateral=True,
        failed_at=1.1,
    )
    world = [receiver, sender]
    root, text = root_cause(world, attribute(first_divergence(world), world), "ended", deviation=own_pattern(world))
    assert root == 1
    assert text.startswith("rank 1 diverged at collective #2: rank 0 called all_reduce([1]) at loss.py:3")
    assert "(in DataLoader batch 2 rank 1 made all_reduce([9]) [DDP gradient bucket] so far" in text
    assert "gloo detected the collective mismatch and rank 0 was killed by SIGABRT" in text


def test_asymmetric_collectives_match_on_what_must_agree():
    def call(op, shapes, site="dcp.py:7 in load"):
        return Collective(1, op, shapes, site, 0)

    for op in ("scatter", "gather", "scatter_object_list", "gather_object", "broadcast_object_list"):
        world = [rank(0, RankState.FINISHED, [call(op, [[2, 1230]])]), rank(1, RankState.FINISHED, [call(op, [])])]
        assert first_divergence(world) is None, op
    for other in (call("all_reduce", []), call("scatter", [], site="other.py:1 in g")):
        world = [rank(0, RankState.BLOCKED, [call("scatter", [[2, 1230]])]), rank(1, RankState.BLOCKED, [other])]
        assert first_divergence(world) is not None
    sized = [
        rank(0, RankState.BLOCKED, [call("all_reduce", [[4]])]),
        rank(1, RankState.BLOCKED, [call("all_reduce", [[5]])]),
    ]
    assert first_divergence(sized) is not None  # a symmetric collective's sizes must still agree


def test_a_fault_that_changed_a_batch_counts_only_where_the_rank_then_made_other_collectives():
    """An EmptyBatch fired on rank 1 at step 0 and its loop trained on the batch (its step-0 collectives are its
    peer's): no evidence, whatever diverged later. Where its loop skipped the batch (no collective at step 0), it is.
    A fault on the collectives (a lone barrier) always is."""
    reduce = Collective(1, "all_reduce", [[1]], "t.py:3 in f", 0)
    world = [
        rank(0, RankState.BLOCKED, [reduce, Collective(2, "barrier", [], "t.py:5 in f", 1)]),
        rank(1, RankState.BLOCKED, [reduce, Collective(2, "all_reduce", [[1]], "t.py:3 in f", 1)]),
    ]
    emptied = [FiredFault(0, "EmptyBatch(rank=1, step=0)", 1, 0, "changed DataLoader batch 0", "changed_batch")]
    assert attribute(first_divergence(world), world, emptied).odd_ranks == ()
    assert culprits(world, emptied) is None
    barrier = [FiredFault(1, "RankOnlyBarrier(rank=0, step=1)", 0, 1, "on_step", "on_step")]
    assert attribute(first_divergence(world), world, emptied + barrier).odd_ranks == (0,)
    skipped = [world[0], rank(1, RankState.BLOCKED, [dataclasses.replace(reduce, seq=1, step=1)])]
    judged = attribute(first_divergence(skipped), skipped, emptied)
    assert judged.odd_ranks == (1,) and "a fault fired on rank 1 only" in judged.basis
