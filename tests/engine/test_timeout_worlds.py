"""The hard timeout on real worlds (2 and 4 gloo ranks, a function world and a script world): a healthy job still
training at its deadline is timed out, with no culprit; a job stuck at its deadline stays hung, with its culprit."""

import os
from collections import Counter

import pytest

import rankfns
from cli import ddpfaults_cli
from ddpfaults import Outcome, RankState, WorldResult, run_script, run_world
from ddpfaults.__main__ import EXIT_TIMED_OUT
from ddpfaults.engine import census
from ddpfaults.judge.verdict import last_progress
from ddpfaults.report.document import read_document

SCRIPT = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support", "scripts", "timed_train.py"
)
# fixed: the hard timeout these tests check fires; the warm ranks train for 60 s, far past it
TIMEOUT, STALL = 5, 2


def _no_survivors(result):
    assert census.survivors([r.pid for r in result.ranks if r.pid]) == []


@pytest.mark.parametrize("world_size", [2, 4])
def test_a_function_world_still_training_at_its_timeout_timed_out_with_no_culprit(fork_server, world_size):
    result = run_world(rankfns.ddp_train_for, world_size=world_size, args=(60,), timeout=TIMEOUT, stall=STALL)
    _timed_out(result, world_size)
    _no_survivors(result)


@pytest.mark.parametrize("world_size", [2, 4])
def test_a_script_still_training_at_its_timeout_timed_out_and_run_exits_3(
    fork_server, tmp_path, capsys, monkeypatch, world_size
):
    """``python -m ddpfaults run train.py --timeout 5`` on a script that trains for a minute."""
    report = tmp_path / "world.json"
    run = ddpfaults_cli(
        capsys,
        monkeypatch,
        "run",
        SCRIPT,
        "--world-size",
        world_size,
        "--timeout",
        TIMEOUT,
        "--json",
        report,
        "--",
        "--seconds",
        "60",
    )
    assert run.returncode == EXIT_TIMED_OUT == 3, run.stdout
    assert f"{world_size}-rank gloo world TIMED OUT" in run.stdout
    assert "root cause: still training at the deadline" in run.stdout
    (world,) = read_document(report)["worlds"]
    result = WorldResult.from_dict(world)
    assert result.step_clock == "optimizer"
    _timed_out(result, world_size)
    _no_survivors(result)


def _timed_out(result: WorldResult, world_size: int) -> None:
    """Timed out, with no rank blamed and no divergence; the root cause says where the ranks were and how recently
    the world moved, as the data shows; each recorded collective sits in its own step."""
    assert result.outcome == Outcome.TIMED_OUT, result.report()
    assert result.reason == f"hard timeout of {TIMEOUT} s reached"
    assert result.root_rank is None and result.divergence is None, result.report()
    assert [r.outcome for r in result.ranks] == [Outcome.TIMED_OUT] * world_size
    steps = sorted({r.last_step for r in result.ranks})
    where = f"step {steps[0]} on every rank" if len(steps) == 1 else f"steps {steps[0]}-{steps[-1]}"
    ago = TIMEOUT - last_progress(result.ranks, until=TIMEOUT)
    assert 0 <= ago < STALL
    assert result.root_cause == (
        f"still training at the deadline: {where}, last progress {ago:.2f} s ago — raise the timeout ({TIMEOUT} s)"
    )
    for rank in result.ranks:
        assert rank.recorder == "flight recorder" and steps[-1] > 20, result.report()
        buckets = Counter(c.step for c in rank.collectives if c.note.startswith("DDP gradient bucket"))
        assert set(buckets.values()) == {1}, f"rank {rank.rank}: steps with more than one gradient bucket"


@pytest.mark.parametrize("form", ["function", "script"])
def test_a_world_stuck_at_its_timeout_stays_hung_and_names_the_rank_that_stopped(fork_server, form):
    """Rank 1 sleeps outside any collective at step 2 while rank 0 waits for it in DDP's gradient all_reduce:
    nothing moves in the stall window before the deadline, and the stall rule never applies (rank 1 is not
    waiting on its peers)."""
    # fixed: a window shorter than rank 1's sleep: the rule (a sleeping rank is not waiting) decides, not the clock
    stall = 1
    if form == "function":
        result = run_world(
            rankfns.ddp_train_for,
            world_size=2,
            args=(60,),
            kwargs={"stuck_rank": 1, "stuck_step": 2},
            timeout=TIMEOUT,
            stall=stall,
        )
    else:
        argv = ["--seconds", "60", "--stuck-rank", "1", "--stuck-step", "2"]
        result = run_script(SCRIPT, argv, world_size=2, timeout=TIMEOUT, stall=stall)
    assert result.outcome == Outcome.HUNG, result.report()
    assert TIMEOUT - last_progress(result.ranks, until=TIMEOUT) >= stall
    assert [r.state for r in result.ranks] == [RankState.BLOCKED, RankState.RUNNING], result.report()
    assert result.root_rank == 1 and "rank 1 still running outside any collective" in result.root_cause
    sleeping_in = (
        ('rankfns.py", line', "in ddp_train_for") if form == "function" else ('timed_train.py", line', "in main")
    )
    assert sleeping_in[0] in result.ranks[1].where and result.ranks[1].where.endswith(sleeping_in[1])
    _no_survivors(result)
