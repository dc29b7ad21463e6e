"""Hugging Face Accelerate loops in real worlds (issue 50): accelerate's ``DataLoaderShard`` fetches one batch ahead,
and the DataLoader seam acts on and records the batches the loop gets, so a rank that skips an empty batch is named
by its own history at two ranks as at four, script and rank function alike. accelerate is in the ``test`` extra (the
README's test command runs these worlds); skipped, saying so, where it is not installed."""

import importlib.util
import os

import pytest

from accelfns import accelerate_loop
from ddpfaults import Outcome, run_script, run_world
from ddpfaults.faults import EmptyBatch
from pairwise import pairwise
from processes import WORLD_GUARD

if importlib.util.find_spec("accelerate") is None:
    pytest.skip("accelerate is not installed (pip install -e '.[test]')", allow_module_level=True)

SCRIPTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support", "scripts")
LOOP = os.path.join(SCRIPTS, "accelerate_loop.py")


def _world(form, world_size, empty, **settings):
    """The Accelerate loop as a script or a rank function; ``empty``: "fault" (``EmptyBatch(rank=1, step=2)``), "data"
    (rank 1's batch 2 is itself empty) or None."""
    faults = [EmptyBatch(rank=1, step=2)] if empty == "fault" else []
    if form == "script":
        argv = ["--empty-rank", "1", "--empty-batch", "2"] if empty == "data" else []
        return run_script(LOOP, argv, world_size=world_size, faults=faults, timeout=WORLD_GUARD, **settings)
    kwargs = {"empty_rank": 1, "empty_batch": 2} if empty == "data" else {}
    return run_world(
        accelerate_loop, world_size=world_size, faults=faults, kwargs=kwargs, timeout=WORLD_GUARD, **settings
    )


@pytest.mark.parametrize(("empty", "world_size", "form"), pairwise(["fault", "data"], [2, 4], ["script", "function"]))
def test_a_rank_whose_accelerate_loop_skips_an_empty_batch_is_named_by_its_own_history(empty, form, world_size):
    """Rank 1 skips its empty batch: its gradient all_reduces pair with its peers' next ones, and the world hangs at
    the closing ``wait_for_everyone()``. At every other batch rank 1 made the gradient all_reduce, at the skipped one
    none: it is named by that, at two ranks too (where "nothing shows which diverged" before the seam recorded the
    batch the loop gets rather than the one the loader fetched ahead)."""
    # fixed: the stall window of the hang this test expects; load calls none sooner (a starved rank is computing)
    result = _world(form, world_size, empty, stall=1.0)
    assert result.outcome == Outcome.HUNG, result.report()
    assert result.root_rank == 1 and result.divergence.odd_ranks == (1,), result.report()
    # script worlds count steps by the optimizer: step 2 is batch 2; the rank function calls ctx.step(i) after it
    # gets batch i, so the fault's step 2 is the batch it then gets, batch 3
    batch = 3 if (empty, form) == ("fault", "function") else 2
    shows = f"(in DataLoader batch {batch} rank 1 made no collective, where its other batches made all_reduce("
    assert shows in result.root_cause, result.report()
    if empty == "fault":
        [fired] = [f for f in result.fired if f.rank == 1]
        assert f"changed DataLoader batch {batch} of this iterator" in fired.how, result.report()


@pytest.mark.parametrize("form", ["script", "function"])
def test_each_gradient_all_reduce_of_an_accelerate_loop_is_placed_in_the_batch_it_trained_on(form):
    """Without a fault the world completes with no divergence, and each rank's gradient all_reduces fall one in each
    batch the loop got (fetched ahead, they fell one batch late: none in batch 0, two in the last)."""
    result = _world(form, 2, None)
    assert result.outcome == Outcome.COMPLETED and result.divergence is None, result.report()
    for rank in result.ranks:
        grads = [c.batch for c in rank.collectives if c.op == "all_reduce" and c.maker == "ddp_bucket"]
        assert grads == [0, 1, 2, 3, 4], (rank.rank, [(c.op, c.maker, c.batch) for c in rank.collectives])
        assert [e["index"] for e in rank.events if e["k"] == "batch"] == [0, 1, 2, 3, 4]
