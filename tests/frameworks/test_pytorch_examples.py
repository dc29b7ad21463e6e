"""The official PyTorch examples' distributed scripts, unmodified (vendored at a pinned commit:
``tests/frameworks/pytorch_examples/README.md``), under ``cuda_on_cpu`` at 2 and 4 ranks.

Before the device layer mapped ``Module.to(int)`` and ``torch.accelerator``, and before a world set up by
``init_device_mesh`` alone counted as distributed, one of these could run: the DDP tutorial crashed in
``model.to(self.gpu_id)`` ("Cannot access accelerator device when none is available"), the FSDP2 and tensor-parallel
examples exited "Unable to locate sufficient 2 gpus", and the tensor-parallel one, forced past that, was called
crashed after its 10 healthy steps. The DDP tutorial's faults are judged as on any CPU script."""

import os

import pytest

from ddpfaults import Outcome, run_script
from ddpfaults.engine import census
from ddpfaults.faults import RankCrash, RankKilled, RankOnlyBarrier, SkippedCollective

pytestmark = pytest.mark.slow  # real trainers: run apart (pyproject.toml)

EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pytorch_examples")
TUTORIAL = os.path.join(EXAMPLES, "ddp-tutorial-series", "multigpu_torchrun.py")
TUTORIAL_ARGV = ["1", "1", "--batch_size", "64"]  # one epoch: 16 steps at 2 ranks, 8 at 4
RUNS = {
    "ddp_tutorial": (TUTORIAL, TUTORIAL_ARGV),
    "fsdp2": (os.path.join(EXAMPLES, "FSDP2", "example.py"), []),
    "tensor_parallel": (os.path.join(EXAMPLES, "tensor_parallelism", "tensor_parallel_example.py"), []),
}


def _run(name, world_size, tmp_path, **settings):
    script, argv = RUNS[name]
    result = run_script(script, argv, world_size=world_size, cuda_on_cpu=True, cwd=str(tmp_path), **settings)
    assert census.survivors([r.pid for r in result.ranks if r.pid]) == []
    return result


@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("name", ["ddp_tutorial", "fsdp2", "tensor_parallel"])
def test_the_example_completes_unmodified(name, world_size, tmp_path):
    result = _run(name, world_size, tmp_path)
    assert result.outcome == Outcome.COMPLETED, result.report()
    if name == "fsdp2":  # its Checkpointer saved the model and the optimizer at the end
        assert os.listdir(tmp_path / "checkpoints"), result.report()


@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize(
    "fault, outcomes",
    [
        (RankCrash(rank=1, step=2), (Outcome.CRASHED,)),
        (RankKilled(rank=1, step=2), (Outcome.CRASHED,)),
        (SkippedCollective(rank=1, step=2, op="ddp_bucket"), (Outcome.HUNG, Outcome.CRASHED)),
        (RankOnlyBarrier(rank=1, step=2), (Outcome.HUNG, Outcome.CRASHED)),
    ],
    ids=["crash", "killed", "skipped_bucket", "lone_barrier"],
)
def test_a_fault_in_the_ddp_tutorial_names_its_rank(fault, outcomes, world_size, tmp_path):
    # fixed: a stall for the cases that may hang; load never calls one sooner (a starved rank computes)
    result = _run("ddp_tutorial", world_size, tmp_path, faults=[fault], stall=3)
    assert result.outcome in outcomes and result.root_rank == 1, result.report()
    assert [f.rank for f in result.fired] == [1], result.report()
