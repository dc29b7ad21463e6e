"""A real GPU trainer, unmodified, on CPU ranks: nanoGPT's ``train.py`` (vendored at a pinned commit:
``tests/frameworks/nanogpt/README.md``) with ``cuda_on_cpu``.

Without the mapping it stops on every rank at its first CUDA-only call, ``init_process_group(backend="nccl")``
(``RuntimeError: Distributed package doesn't have NCCL built in``, at train.py:84, before ``set_device`` at line
89). With it, a 2-layer GPT trains on a synthetic token file for a few iterations with DDP and gradient
accumulation, evaluates, checkpoints, and its replicas end equal; a ``RankKilled`` at an optimizer step is judged as
on any CPU script (crashed, the killed rank named).
"""

import os
import pickle

import numpy as np
import pytest

from ddpfaults import Outcome, RankState, run_script
from ddpfaults.engine import census
from ddpfaults.faults import RankKilled

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
    result = run_script(TRAIN, ARGV, world_size=2, cwd=workdir, stall=20, timeout=120)
    assert result.outcome == Outcome.CRASHED, result.report()
    for rank in result.ranks:
        assert rank.error == "RuntimeError: Distributed package doesn't have NCCL built in", result.report()
        assert rank.site.startswith("train.py:84 in"), rank.site
    assert _survivors(result) == []


def test_nanogpt_trains_unmodified_with_the_mapping(workdir):
    result = run_script(TRAIN, ARGV, world_size=2, cwd=workdir, cuda_on_cpu=True, stall=20, timeout=120)
    assert result.outcome == Outcome.COMPLETED, result.report()
    assert [r.last_step for r in result.ranks] == [5, 5]  # iterations 0..4: five optimizer steps
    digests = {w["digest"] for r in result.ranks for w in r.wrapped}
    assert len(digests) == 1, result.report()  # DDP kept the replicas equal
    assert (workdir / "out" / "ckpt.pt").exists()
    assert "iter 4: loss" in result.ranks[0].output
    assert _survivors(result) == []


def test_a_rank_killed_in_nanogpt_is_named(workdir):
    result = run_script(
        TRAIN, ARGV, world_size=2, cwd=workdir, cuda_on_cpu=True, faults=[RankKilled(rank=1, step=2)], stall=20
    )
    assert result.outcome == Outcome.CRASHED and result.root_rank == 1, result.report()
    assert result.ranks[1].state == RankState.DIED
    assert "--cuda-on-cpu true" in result.replay
    assert _survivors(result) == []
