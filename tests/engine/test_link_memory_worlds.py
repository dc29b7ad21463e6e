"""OutOfMemory, SlowLink and DroppedLink in real gloo worlds: run_world, the CLI's --faults, script worlds."""

import json
import os

import memoryfns
import rankfns
from ddpfaults import Outcome, RankState, run_script, run_world
from ddpfaults.__main__ import main
from ddpfaults.faults import DroppedLink, OutOfMemory, SlowLink

SUPPORT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support")
PLAIN = os.path.join(SUPPORT, "scripts", "plain_train.py")


def test_out_of_memory_lasts_one_step_on_its_rank_only():
    result = run_world(
        memoryfns.allocate_each_step,
        world_size=2,
        kwargs={"catch": True},
        # fixed: a long stall: no hang is expected; a rank allocating memory is computing, not waiting
        stall=10,
        faults=[OutOfMemory(rank=1, step=1)],
    )
    assert result.outcome == Outcome.COMPLETED, result.report()
    assert result.values == [[True, True, True], [True, False, True]]
    (fired,) = result.fired
    assert (fired.rank, fired.step) == (1, 1) and fired.how.startswith("limited the address space to ")
    assert "an allocation failed under it: RuntimeError" in fired.how  # caught by the code, seen all the same


def test_out_of_memory_through_the_cli_is_a_crash_of_its_rank(tmp_path, capsys):
    report = tmp_path / "r.json"
    code = main(
        [
            "run",
            "tests/support/memoryfns.py:allocate_each_step",
            "--world-size",
            "3",
            "--stall",
            "10",
            "--faults",
            "[OutOfMemory(rank=2, step=1)]",
            "--json",
            str(report),
        ]
    )
    out = capsys.readouterr().out
    assert code != 0 and "CRASHED" in out, out
    assert "root cause: rank 2 raised RuntimeError" in out and "DefaultCPUAllocator: can't allocate memory" in out
    assert "OutOfMemory(rank=2, step=1) fired on rank 2 at step 1" in out
    (world,) = json.loads(report.read_text())["worlds"]
    assert world["outcome"] == "crashed" and world["ranks"][2]["state"] == "raised"


def test_link_faults_act_on_a_script_worlds_ddp_buckets():
    slow = run_script(PLAIN, world_size=2, faults=[SlowLink(rank=0, step=1, op="ddp_bucket", delay=0.2)])
    assert slow.outcome == Outcome.COMPLETED, slow.report()
    assert [f.how for f in slow.fired] == ["held ddp_bucket back 0.2 s"]
    dropped = run_script(PLAIN, world_size=2, faults=[DroppedLink(rank=1, step=1, op="ddp_bucket")])
    assert dropped.outcome == Outcome.CRASHED and dropped.root_rank == 1, dropped.report()
    # one gloo connection (to the one peer): the TCPStore's connection at MASTER_PORT is left alone
    assert [(f.rank, f.how) for f in dropped.fired] == [(1, "shut down its 1 gloo connection(s) entering ddp_bucket")]
    assert dropped.ranks[1].error.startswith("LinkDropped: rank 1's links to its peers dropped entering ddp_bucket")
    assert dropped.ranks[0].state == RankState.RAISED and "Connection closed by peer" in dropped.ranks[0].error


def test_a_slow_link_longer_than_the_stall_window_is_a_straggler_not_a_hang():
    """The held-back rank sleeps in the fault, outside any collective: its peers wait on it, the world is not hung."""
    plan = [SlowLink(rank=1, step=1, op="all_reduce", delay=1.5)]
    # fixed: below the 1.5 s delay on purpose: a sleeping rank is not waiting, so the rule, not the clock, decides
    result = run_world(rankfns.all_reduce_steps, world_size=2, stall=1.0, faults=plan)
    assert result.outcome == Outcome.COMPLETED, result.report()
    assert [f.how for f in result.fired] == ["held all_reduce back 1.5 s"]


def test_out_of_memory_whose_limit_no_allocation_reaches_never_fires_and_says_why():
    """plain_train.py never allocates 32 MiB within a step: the limit is in force for step 1, nothing fails, so the
    fault changed nothing and is not reported as fired."""
    result = run_script(PLAIN, world_size=2, faults=[OutOfMemory(rank=1, step=1)], require_faults_fire=False)
    assert result.outcome == Outcome.COMPLETED and result.fired == [], result.report()
    (unfired,) = result.unfired
    assert unfired.finished == (1,) and "no allocation of its step failed under the address-space limit" in unfired.hint
    assert "the fault changed nothing" in unfired.describe()
