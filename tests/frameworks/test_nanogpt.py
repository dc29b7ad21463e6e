"""A real GPU trainer, unmodified, on CPU ranks: nanoGPT's ``train.py`` (vendored at a pinned commit:
``tests/frameworks/nanogpt/README.md``) with ``cuda_on_cpu``.

Without the mapping it stops on every rank at its first CUDA-only call, ``init_process_group(backend="nccl")``
(``RuntimeError: Distributed package doesn't have NCCL built in``, at train.py:84, before ``set_device`` at line
89). With it, a 2-layer GPT trains on a synthetic token file for a few iterations with DDP and gradient
accumulation, evaluates, checkpoints, and its replicas end equal; a ``RankKilled`` at an optimizer step is judged as
on any CPU script (crashed, the killed rank named). A DDP gradient bucket one rank skips pairs every later step's
bucket with its peers' previous one (the model's one bucket a step: same size): a finding of its own, in a run
that crashes at its end and in one that completes.
"""

import os
import pickle

import numpy as np
import pytest

from ddpfaults import Outcome, RankState, run_script
from ddpfaults.engine import census
from ddpfaults.faults import RankKilled, SkippedCollective
from processes import WORLD_GUARD

pytestmark = pytest.mark.slow  # a real trainer: run apart (pyproject.toml)

NANOGPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "nanogpt")
TRAIN = os.path.join(NANOGPT, "train.py")
ARGV = [
    "--dataset=synthetic",
    "--n_layer=2",
    "--n_head=2",
    "--n_embd=32",
    "--block_size=32",
    "--batch_size=4",
    "--gradient_accumulation_steps=2",
    "--max_iters=4",
    "--lr_decay_iters=4",
    "--warmup_iters=1",
    "--eval_interval=2",
    "--eval_iters=2",
    "--log_interval=1",
    "--compile=False",
]


@pytest.fixture
def workdir(tmp_path):
    """nanoGPT's working directory: its configurator (train.py reads it from there) and a synthetic token file."""
    with open(os.path.join(NANOGPT, "configurator.py")) as f:
        (tmp_path / "configurator.py").write_text(f.read())
    data = tmp_path / "data" / "synthetic"
    data.mkdir(parents=True)
    tokens = np.random.default_rng(0).integers(0, 64, size=20_000, dtype=np.uint16)
    tokens[:16_000].tofile(data / "train.bin")
    tokens[16_000:].tofile(data / "val.bin")
    with open(data / "meta.pkl", "wb") as f:
        pickle.dump({"vocab_size": 64}, f)
    return tmp_path


def _survivors(result):
    return census.survivors([r.pid for r in result.ranks if r.pid])


def test_nanogpt_needs_the_mapping_on_a_cpu_machine(workdir):
    # fixed: a long stall: no hang is expected; ranks importing a big library on a loaded machine are not one
    result = run_script(TRAIN, ARGV, world_size=2, cwd=workdir, stall=20, timeout=WORLD_GUARD)
    assert result.outcome == Outcome.CRASHED, result.report()
    for rank in result.ranks:
        assert rank.error == "RuntimeError: Distributed package doesn't have NCCL built in", result.report()
        assert rank.site.startswith("train.py:84 in"), rank.site
    assert _survivors(result) == []


def test_nanogpt_trains_unmodified_with_the_mapping(workdir):
    # fixed: a long stall: no hang is expected; ranks importing a big library on a loaded machine are not one
    result = run_script(TRAIN, ARGV, world_size=2, cwd=workdir, cuda_on_cpu=True, stall=20, timeout=WORLD_GUARD)
    assert result.outcome == Outcome.COMPLETED, result.report()
    assert [r.last_step for r in result.ranks] == [5, 5]  # iterations 0..4: five optimizer steps
    digests = {w["digest"] for r in result.ranks for w in r.wrapped}
    assert len(digests) == 1, result.report()  # DDP kept the replicas equal
    assert (workdir / "out" / "ckpt.pt").exists()
    assert "iter 4: loss" in result.ranks[0].output
    assert _survivors(result) == []


def test_a_rank_killed_in_nanogpt_is_named(workdir):
    result = run_script(
        TRAIN,
        ARGV,
        world_size=2,
        cwd=workdir,
        cuda_on_cpu=True,
        faults=[RankKilled(rank=1, step=2)],
        # fixed: a long stall: no hang is expected; ranks importing a big library on a loaded machine are not one
        stall=20,
    )
    assert result.outcome == Outcome.CRASHED and result.root_rank == 1, result.report()
    assert result.ranks[1].state == RankState.DIED
    assert "--cuda-on-cpu true" in result.replay
    assert _survivors(result) == []


def _iterations(world_size, iters):
    """ARGV for ``iters + 1`` optimizer steps (iterations 0..iters) at ``world_size`` ranks (nanoGPT divides its
    gradient accumulation steps among the ranks)."""
    changed = {"--gradient_accumulation_steps": world_size, "--max_iters": iters, "--lr_decay_iters": iters}
    return [f"{a.split('=')[0]}={changed[a.split('=')[0]]}" if a.split("=")[0] in changed else a for a in ARGV]


def test_a_skipped_bucket_pairs_every_later_step_with_the_next_until_the_run_ends(workdir):
    """The issue's case: rank 1 skips its bucket at step 3; rank 0's steps 3-9 are averaged with rank 1's 4-10
    (7 steps), then rank 1 ends its run and destroys its group while rank 0 waits in its step-10 bucket."""
    skip = SkippedCollective(rank=1, step=3, op="ddp_bucket")
    argv = _iterations(2, 10)
    result = run_script(
        TRAIN,
        argv,
        world_size=2,
        cwd=workdir,
        cuda_on_cpu=True,
        faults=[skip],
        # fixed: a long stall: no hang is expected; ranks importing a big library on a loaded machine are not one
        stall=20,
        timeout=WORLD_GUARD,
    )
    assert result.outcome == Outcome.CRASHED and result.root_rank == 1, result.report()
    assert "a fault fired on rank 1 only" in result.root_cause, result.report()
    desync = result.desync
    assert (desync.first_step, desync.steps, desync.at) == (3, 7, ((0, 3), (1, 4))), result.report()
    assert desync.call.endswith("[DDP gradient bucket]") and desync.describe() in result.report()
    assert _survivors(result) == []


def test_a_skipped_bucket_paired_across_steps_in_a_run_that_completes_is_reported(workdir):
    """4 ranks: rank 1 skips its bucket at step 3, the others theirs at step 8; every rank makes as many and the
    run completes, rank 0's steps 3-7 averaged with rank 1's next (5 steps)."""
    faults = [
        SkippedCollective(rank=1, step=3, op="ddp_bucket"),
        SkippedCollective(rank=[0, 2, 3], step=8, op="ddp_bucket"),
    ]
    argv = _iterations(4, 10)
    result = run_script(
        TRAIN,
        argv,
        world_size=4,
        cwd=workdir,
        cuda_on_cpu=True,
        faults=faults,
        # fixed: a long stall: no hang is expected; ranks importing a big library on a loaded machine are not one
        stall=20,
        timeout=WORLD_GUARD,
    )
    assert result.outcome == Outcome.COMPLETED and result.root_cause == "no failure", result.report()
    desync = result.desync
    assert (desync.first_step, desync.steps) == (3, 5), result.report()
    assert desync.at == ((0, 3), (1, 4), (2, 3), (3, 3)) and desync.describe() in result.report()
    assert _survivors(result) == []
