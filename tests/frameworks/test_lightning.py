"""A real third-party trainer as a script world: PyTorch Lightning, unmodified, on CPU gloo ranks.

``tests/support/scripts/lightning_train.py`` is a plain Lightning script (no ddpfaults import) that calls
``Trainer(accelerator="cpu", strategy="ddp", devices=WORLD_SIZE)``; Lightning detects torchrun's worker environment
(``TorchElasticEnvironment``) and joins the world instead of spawning its own processes. ``EmptyBatch`` empties
the batch Lightning's DataLoader yields on rank 1 at step 1; under plain ``torchrun`` the script's own
``--empty-rank 1 --empty-step 1`` empties the same batch (batch 1: Lightning does not prefetch from a sized loader).

Ground truth, measured with lightning 2.6.6 / torch 2.13.0+cpu on a 2-core machine with
``timeout -k 5 180 python -m torch.distributed.run --standalone --nproc-per-node=N lightning_train.py
--strategy S --empty-rank 1 --empty-step 1`` (the two failing cases repeated twice, 2 and 3 ranks):

- ``naive`` (``training_step`` returns None for the empty batch): CRASHED, torchrun exit status 1 after 7-8 s.
  Rank 1 raises Lightning's own ``RuntimeError: Skipping the `training_step` by returning None in distributed
  training is not supported...`` and exits 1; every other rank, already in its step-1 gradient all_reduce, raises
  ``RuntimeError: ... Connection closed by peer`` as torchrun SIGTERMs it (exit -15). torchrun's "Root Cause (first
  observed failure)" is rank 1, exitcode 1 (N = 2 and N = 3 alike).
- ``detached`` (a zero loss that is not connected to the model, the usual workaround for that error): HUNG. No rank
  printed anything or exited until the deadline (N = 2: 120 s; N = 3: 180 s); torchrun's SIGTERM then did not stop
  the workers (Lightning's SIGTERM handler only sets a flag, and they sit in gloo), torchrun SIGKILLed them 30 s
  later. Rank 1 skipped its step-1 gradient all_reduce, so it runs one collective ahead of its peers.
- ``fixed`` (a zero loss over the whole graph): COMPLETED, exit status 0 after 7.7 s (N = 2), every rank
  "done after 4 steps".
"""

import importlib.util
import os
import re
import signal
import subprocess
import sys

import psutil
import pytest

from ddpfaults import Outcome, RankState, run_script
from ddpfaults.engine import census
from ddpfaults.faults import EmptyBatch

# a third-party trainer's worlds: run apart (pyproject.toml); optional: the rank processes import it, this module does
# not (importing it costs every worker ~2 s); a mark, not a module-level skip, so a run without slow tests skips none
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("lightning") is None, reason="lightning is not installed"),
]

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(TESTS, "support", "scripts", "lightning_train.py")
LIGHTNING_REFUSES = "RuntimeError: Skipping the `training_step` by returning None in distributed training"
TORCHRUN_DEADLINE = 180  # s; the naive world crashes in about 8 s under torchrun


def _no_survivors(result):
    assert census.survivors([r.pid for r in result.ranks if r.pid]) == []


def _empty_batch(strategy, world_size, **kwargs):
    return run_script(
        SCRIPT, ["--strategy", strategy], world_size=world_size, faults=[EmptyBatch(rank=1, step=1)], **kwargs
    )


def _check_naive(result, world_size):
    """The verdict plain torchrun gives (see the module docstring): crashed, rank 1 is the root cause."""
    assert result.outcome == Outcome.CRASHED, result.report()
    assert result.root_rank == 1, result.report()
    one = result.ranks[1]
    assert one.state == RankState.RAISED and not one.collateral and one.last_step == 1
    assert one.error.startswith(LIGHTNING_REFUSES) and one.site.startswith("automatic.py:"), one.site
    assert LIGHTNING_REFUSES in result.root_cause
    for peer in set(range(world_size)) - {1}:
        # gloo tells a peer "Connection closed by peer" or, reading as the socket dies, "Read error ... Connection
        # reset by peer" (seen once in a fresh-clone run): either is the peer failure the judge calls collateral
        error = result.ranks[peer].error
        assert result.ranks[peer].collateral and re.search(r"Connection (closed|reset) by peer", error), error
    assert [(f.rank, f.step) for f in result.fired] == [(1, 1)]
    assert "changed DataLoader batch 1 of this iterator" in result.fired[0].how
    _no_survivors(result)


def test_naive_empty_batch_crashes_on_the_rank_lightning_refuses():
    """Measured under torchrun (3 ranks): rank 1 exits 1 with Lightning's RuntimeError, ranks 0 and 2 fail with
    "Connection closed by peer" in their step-1 gradient all_reduce; torchrun's root cause is rank 1."""
    _check_naive(_empty_batch("naive", 3), 3)


def test_detached_zero_loss_hangs_with_rank_1_a_collective_ahead():
    """Measured under torchrun (2 ranks, 120 s; 3 ranks, 180 s): hung until the deadline, no rank exited.
    Rank 1's zero loss touches no parameter, so its DDP gradient all_reduce never happens: it moves on to
    Lightning's next collective (its per-step SIGTERM broadcast) while ranks 0 and 2 wait in the all_reduce."""
    # fixed: the deadline that may call this hang (ranks waiting, not training): HUNG either way
    result = _empty_batch("detached", 3, timeout=60)
    assert result.outcome == Outcome.HUNG, result.report()
    assert result.root_rank == 1, result.report()
    assert [r.state for r in result.ranks] == [RankState.BLOCKED] * 3
    assert result.divergence is not None and result.divergence.odd_ranks == (1,), result.report()
    assert "DDP gradient bucket" in result.ranks[0].where and "DDP gradient bucket" in result.ranks[2].where
    assert "_broadcast_sigterm_tensor" in result.ranks[1].where, result.ranks[1].where
    assert [r.last_step for r in result.ranks] == [1, 2, 1]
    _no_survivors(result)


def test_fixed_empty_batch_completes_and_lightning_joined_the_torchrun_world():
    """Measured under torchrun (2 ranks): exit status 0, both ranks "done after 4 steps"."""
    result = _empty_batch("fixed", 2)
    assert result.outcome == Outcome.COMPLETED, result.report()
    assert [r.last_step for r in result.ranks] == [4, 4]
    assert len(result.fired) == 1
    for r in result.ranks:  # Lightning found torchrun's environment: it did not launch processes of its own
        assert f"rank {r.rank} of 2 (TorchElasticEnvironment) done after 4 steps" in r.output, r.output
    _no_survivors(result)


def _torchrun(argv, nproc, deadline, log_dir):
    """Run ``argv`` under plain torchrun, its logs in ``log_dir`` (else it leaves a torchelastic_* dir in /tmp);
    (exit status, output, worker pids). On the deadline, SIGKILL torchrun's process group and every worker it
    started (torchrun gives each worker a session of its own)."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
    command += [f"--log-dir={log_dir}"] + argv
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        out, _ = proc.communicate(timeout=deadline)
    except subprocess.TimeoutExpired:
        try:
            workers = psutil.Process(proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            workers = []
        for pid in [proc.pid] + [w.pid for w in workers]:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.communicate()
        pytest.fail(f"plain torchrun did not finish within {deadline} s")
    return proc.returncode, out, [int(p) for p in re.findall(r"\(pid: (\d+)\)", out)] + [proc.pid]


def test_plain_torchrun_gives_the_same_verdict(tmp_path):
    """The naive case run by plain torchrun and by run_script: both crashed, rank 1 the root cause, same error."""
    argv = [SCRIPT, "--strategy", "naive", "--empty-rank", "1", "--empty-step", "1"]
    status, out, pids = _torchrun(argv, 2, TORCHRUN_DEADLINE, tmp_path / "torchelastic")
    assert census.survivors(pids) == []
    assert status == 1, out
    root = out.split("Root Cause (first observed failure):", 1)[1]
    assert re.search(r"rank\s*: 1 \(local_rank: 1\)\s*\n\s*exitcode\s*: 1 ", root), root
    assert f"[rank1]: {LIGHTNING_REFUSES}" in out

    result = _empty_batch("naive", 2)
    _check_naive(result, 2)
    torchrun_error = re.search(r"\[rank1\]: (RuntimeError: .*)", out).group(1)
    assert result.ranks[1].error == torchrun_error
