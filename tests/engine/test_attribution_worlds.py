"""Which rank diverged, judged from what each rank did, in real worlds: one against one as well as three against
one, a fault injected or the data itself empty or short, scripts and rank functions alike."""

import os

import pytest

from ddpfaults import Expect, Outcome, run_script, run_world
from ddpfaults.faults import EmptyBatch, RankOnlyBarrier, UnevenInputs
from processes import WORLD_GUARD
from rankfns import asymmetric_collectives, fsdp_dcp_round_trip, split_train

SPLIT = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support", "scripts", "split_train.py"
)

#: (case, faults, script argv, function kwargs, what the root cause must say shows it)
CASES = [
    ("empty_batch_fault", [EmptyBatch(rank=1, step=1)], [], {}, "made no collective"),
    ("empty_data", [], ["--empty-rank", "1", "--empty-batch", "2"], {"empty_rank": 1, "empty_batch": 2}, "made no"),
    ("uneven_fault", [UnevenInputs(rank=1, batches=3)], [], {}, "rank 1 left its loop early"),
    ("short_data", [], ["--short-rank", "1"], {"short_rank": 1}, "rank 1 left its loop early"),
    ("rank_only_barrier", [RankOnlyBarrier(rank=1, step=2)], [], {}, "barrier"),
]


@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("case, faults, argv, kwargs, shows", CASES, ids=[c[0] for c in CASES])
def test_a_script_names_the_rank_that_diverged(world_size, case, faults, argv, kwargs, shows):
    # fixed: the stall window of the hang this test expects; load calls none sooner (a starved rank is computing)
    result = run_script(SPLIT, argv, world_size=world_size, faults=faults, stall=1.0, timeout=WORLD_GUARD)
    assert result.outcome == Outcome.HUNG, result.report()
    assert result.root_rank == 1, result.report()
    assert result.root_cause.startswith("rank 1 ") and shows in result.root_cause, result.report()
    assert result.divergence.odd_ranks == (1,)


@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("case, faults, argv, kwargs, shows", CASES, ids=[c[0] for c in CASES])
def test_a_rank_function_names_the_rank_that_diverged(world_size, case, faults, argv, kwargs, shows):
    # fixed: the stall window of the hang this test expects; load calls none sooner (a starved rank is computing)
    result = run_world(split_train, world_size=world_size, faults=faults, kwargs=kwargs, stall=1.0, timeout=WORLD_GUARD)
    assert result.outcome == Outcome.HUNG, result.report()
    assert result.root_rank == 1, result.report()
    assert shows in result.root_cause, result.report()


@pytest.mark.parametrize("world_size", [2, 3])
def test_asymmetric_collectives_of_a_completed_world_are_no_divergence(world_size):
    result = run_world(asymmetric_collectives, world_size=world_size, timeout=WORLD_GUARD)
    assert result.outcome == Outcome.COMPLETED, result.report()
    assert result.divergence is None, result.report()
    assert "divergent" not in result.report()
    ops = {c.op for c in result.ranks[0].collectives}
    assert {"scatter", "gather"} <= ops, ops  # the record saw them, and matched them across ranks


def test_an_fsdp2_and_dcp_world_is_recorded_by_maker_with_no_divergence(tmp_path):
    """FSDP2 trains, DCP saves and loads (its scatter and gather pass lists on one rank only): the world completes
    with no divergence, and each recorded collective says who made it (FSDP, DTensor, DCP), never DDP."""
    result = run_world(
        fsdp_dcp_round_trip, world_size=2, kwargs={"checkpoint_dir": str(tmp_path / "ckpt")}, timeout=WORLD_GUARD
    )
    assert result.outcome == Outcome.COMPLETED, result.report()
    assert result.divergence is None and "divergent" not in result.report()
    before, after = result.values[0]
    assert before == after and result.values[0] == result.values[1]  # the round trip kept the full state
    makers = {(c.op, c.maker) for c in result.ranks[0].collectives}
    assert ("all_gather", "fsdp_all_gather") in makers and ("scatter", "dcp") in makers, makers
    assert any(maker == "fsdp_reduce_scatter" for _, maker in makers), makers
    assert not any(maker.startswith("ddp") for _, maker in makers), makers
    # the two roots fully_shard made (each layer is inside its root), sharded: the replica check leaves them out
    assert [(w["kind"], w["sharded"]) for w in result.ranks[0].wrapped] == [("fsdp", True), ("fsdp", True)]
    assert Expect("completed", values_equal=True).mismatches(result) == []  # the values are compared instead


@pytest.mark.parametrize(
    "faults, argv",
    [([EmptyBatch(rank=1, step=2)], ["--criterion"]), ([], ["--criterion", "--empty-rank", "1", "--empty-batch", "2"])],
    ids=["fault", "data"],
)
def test_a_gloo_size_abort_names_the_rank_that_skipped_not_the_receiver(faults, argv):
    """One against one: rank 1 skips batch 2 (its sample-count all_reduce and its backward); its next count meets
    rank 0's gradient all_reduce and gloo aborts whichever rank received the other's: rank 1 is named either way."""
    result = run_script(SPLIT, argv, world_size=2, faults=faults, timeout=WORLD_GUARD)
    assert result.outcome == Outcome.CRASHED, result.report()
    assert result.root_rank == 1, result.report()
    assert "gloo detected the collective mismatch" in result.root_cause, result.report()
