"""The resume check on a real trainer run unmodified: the Hugging Face ``Trainer``.

``tests/support/scripts/hf_trainer.py`` (no ddpfaults import) trains a tiny GPT-2 with dropout on synthetic tokens,
``use_cpu=True`` on gloo, checkpointing every step and resuming with the stock ``trainer.train(resume_from_checkpoint=
...)``. accelerate's ``DataLoaderShard`` fetches one batch ahead and the Trainer skips the resumed epoch's batches by
drawing them: neither is a difference, since a step's batch is what reached the model's forward. Rank 1 is killed at
step 5 (the Trainer has checkpointed 4 steps); the restarted attempt resumes from checkpoint-4.

Ground truth (measured under torchrun, 2 and 4 ranks): the stock resume is bit-equal to the uninterrupted run.
``--ignore-data-skip`` (``TrainingArguments(ignore_data_skip=True)``) starts the resumed epoch over: samples
replayed at step 4. Importing transformers takes 15-30 s of CPU per rank on a loaded machine: the deadlines are
generous, and nothing here depends on speed.
"""

import importlib.util
import os

import pytest

from ddpfaults import Outcome, run_script
from ddpfaults.engine import census
from ddpfaults.faults import RankKilled

if importlib.util.find_spec("transformers") is None or importlib.util.find_spec("accelerate") is None:
    pytest.skip("transformers or accelerate is not installed", allow_module_level=True)

# a third-party trainer's worlds: run apart (pyproject.toml); 4 ranks importing transformers on a loaded 2-core
# machine outlast pytest-timeout's default
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(TESTS, "support", "scripts", "hf_trainer.py")
SLOW = dict(timeout=900, stall=300, startup=600)  # transformers' import: see the module


def _resumed(tmp_path, world_size, argv=()):
    result = run_script(
        SCRIPT,
        list(argv),
        world_size=world_size,
        faults=[RankKilled(rank=1, step=5)],
        max_restarts=1,
        check_resume=True,
        cwd=tmp_path,
        **SLOW,
    )
    assert census.survivors([r.pid for r in result.ranks if r.pid]) == []
    assert result.outcome == Outcome.COMPLETED, result.report()
    assert [a["outcome"] for a in result.attempts] == ["crashed", "completed"], result.report()
    assert os.listdir(tmp_path) == [], "each run works in a copy of the working directory"
    return result


@pytest.mark.parametrize("world_size", [2, 4])
def test_the_stock_resume_from_checkpoint_resumes_equivalent(tmp_path, world_size):
    result = _resumed(tmp_path, world_size)
    assert result.resume["equivalent"] is True, result.report()
    assert result.resume["steps"] == 8 and result.resume["final_identical"], result.report()


@pytest.mark.parametrize("world_size", [2, 4])
def test_ignore_data_skip_is_caught_at_its_resumed_step(tmp_path, world_size):
    result = _resumed(tmp_path, world_size, ["--ignore-data-skip"])
    first = result.resume["first_difference"]
    assert result.resume["equivalent"] is False, result.report()
    assert (first["step"], first["cause"], first["attempt"]) == (4, "samples_replayed", 1), result.report()
