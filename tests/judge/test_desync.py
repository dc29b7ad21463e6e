"""Unit tests of ddpfaults.judge.desync: collectives paired across steps, from hand-built rank results."""

from ddpfaults.judge.desync import cross_step
from ddpfaults.judge.results import Collective, Desync, Outcome, RankResult, RankState, WorldResult


def calls(steps, *, op="all_reduce", shapes=([36],), site="train.py:31 in main"):
    return [Collective(i + 1, op, list(shapes), site, step) for i, step in enumerate(steps)]


def finished(rank, steps, **kw):
    return RankResult(rank, RankState.FINISHED, collectives=calls(steps, **kw))


def test_a_skipped_reduction_pairs_every_later_step_with_the_next_one():
    ranks = [finished(0, range(8)), finished(1, [0, 1, 2, 4, 5, 6, 7, 7])]
    desync = cross_step(ranks)
    assert desync == Desync(
        index=4, first_step=3, steps=4, at=((0, 3), (1, 4)), call="all_reduce([36]) at train.py:31 in main"
    )
    assert desync.describe() == (
        "collectives paired across steps from step 3: collective #4, all_reduce([36]) at train.py:31 in main, was "
        "step 3 on rank 0, step 4 on rank 1; 4 steps ran paired wrong"
    )
    world = WorldResult(Outcome.COMPLETED, ranks, "no failure", None, "ended", 1.0, desync=desync)
    assert WorldResult.from_dict(world.to_dict()).desync == desync
    assert desync.describe() in world.report()


def test_calls_in_step_on_every_rank_or_a_real_divergence_are_no_cross_step_pairing():
    assert cross_step([finished(0, range(5)), finished(1, range(5))]) is None
    other = [finished(0, range(5)), RankResult(1, RankState.BLOCKED, collectives=calls([0, 1, 3], shapes=([2],)))]
    assert cross_step(other) is None  # sizes differ: a divergence, not a pairing
    assert cross_step([finished(0, [None, None]), finished(1, [None, 0])]) is None  # no step to compare
    assert cross_step([finished(0, range(3))]) is None


def test_a_rank_out_of_its_loop_whose_calls_keep_its_last_step_is_not_training_on():
    """Join's shadow collectives: rank 1 ran out of inputs at step 2 and shadows its peers' steps 3 and 4."""
    assert cross_step([finished(0, range(5)), finished(1, [0, 1, 2, 2, 2])]) is None


def test_the_last_step_of_a_rank_whose_data_ran_out_early_still_counts_as_paired_wrong():
    """Rank 0's data ran out a batch early and rank 1 skipped its reduction at step 3: as many calls each, and rank
    0's last step (its backward, in its loop) was averaged with rank 1's step 7 like steps 3-5 with the next; a
    closing barrier past it is out of the loop."""
    ranks = [finished(0, [*range(7), 6]), finished(1, [0, 1, 2, 4, 5, 6, 7, 7])]
    assert (cross_step(ranks).first_step, cross_step(ranks).steps) == (3, 4)
    shadowed = [finished(0, range(6)), finished(1, [0, 1, 2, 4, 4, 4])]  # rank 1 out of inputs after its step 4
    assert cross_step(shadowed).steps == 1  # rank 0's step 3 met rank 1's step 4; its steps 4 and 5 met shadows
