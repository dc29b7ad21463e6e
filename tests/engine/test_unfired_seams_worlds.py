"""A fault that never fired on code that never used its seam says so, naming the seams the code did use: real worlds
at 2 and 4 ranks, a script with no DataLoader (batches drawn with torch.randint, as nanoGPT's) and a rank
function that draws no batch."""

import os

import pytest

from ddpfaults import Outcome, run_script, run_world
from ddpfaults.errors import FaultNeverFired
from ddpfaults.faults import EmptyBatch
from processes import WORLD_GUARD
from rankfns import all_reduce_steps

SCRIPT = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support", "scripts", "no_loader_train.py"
)
NO_LOADER = "it acts through batches drawn from a DataLoader, which the ranks it targets never used"


@pytest.mark.parametrize("world_size", [2, 4])
def test_an_empty_batch_on_a_script_with_no_dataloader_names_the_seams_it_used(world_size):
    result = run_script(
        SCRIPT,
        world_size=world_size,
        faults=[EmptyBatch(rank=1, step=1)],
        require_faults_fire=False,
        timeout=WORLD_GUARD,
    )
    assert result.outcome == Outcome.COMPLETED, result.report()
    (unfired,) = result.unfired
    assert unfired.finished == (1,)
    assert unfired.hint == f"{NO_LOADER} (the seams they used: DistributedDataParallel, optimizer steps)"
    assert unfired.hint in result.report()


@pytest.mark.parametrize("world_size", [2, 4])
def test_an_empty_batch_on_a_rank_function_that_draws_none_fails_with_the_hint(world_size):
    with pytest.raises(FaultNeverFired) as raised:
        run_world(all_reduce_steps, world_size=world_size, faults=[EmptyBatch(rank=0, step=1)], timeout=WORLD_GUARD)
    (unfired,) = raised.value.result.unfired
    assert unfired.hint == f"{NO_LOADER} (the seams they used: collectives of its own, ctx.step)"
    assert NO_LOADER in str(raised.value)
