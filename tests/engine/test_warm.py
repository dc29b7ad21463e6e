"""Warm worlds: healthy worlds are reused; any fault, failure or leftover state gets a world torn down."""

import os
import subprocess
import sys
import textwrap

import pytest

import rankfns
from ddpfaults import run_world
from ddpfaults.engine import census, pool
from ddpfaults.faults import RankCrash, SkippedCollective, Straggler
from processes import alive

#: tests/support (the helper modules): the launcher script below runs outside pytest, so it puts them on sys.path
SUPPORT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support")


@pytest.fixture(autouse=True)
def _empty_pool():
    pool.close_all()
    yield
    pool.close_all()


def _pids(result):
    return [r.pid for r in result.ranks]


def test_a_healthy_world_is_reused_by_the_next_run_of_the_same_shape():
    first = run_world(rankfns.all_reduce_steps, world_size=3)
    second = run_world(rankfns.all_reduce_steps, world_size=3, seed=9)
    assert (first.warm, first.reused, second.warm, second.reused) == (False, True, True, True)
    assert _pids(second) == _pids(first)
    assert second.values == first.values == [81.0] * 3
    other_shape = run_world(rankfns.all_reduce_steps, world_size=2)
    assert not other_shape.warm and set(_pids(other_shape)).isdisjoint(_pids(first))


@pytest.mark.parametrize(
    "fault, outcome",
    [
        (Straggler(rank=0, step=0, seconds=0.1), "completed"),
        (RankCrash(rank=1, step=1), "crashed"),
        (SkippedCollective(rank=1, step=3), "hung"),
    ],
)
def test_a_world_that_saw_a_fault_is_torn_down(fault, outcome):
    warm = run_world(rankfns.all_reduce_steps, world_size=3)
    faulty = run_world(rankfns.all_reduce_steps, world_size=3, faults=[fault], stall=0.5)
    assert faulty.warm and faulty.outcome == outcome and not faulty.reused
    assert alive(_pids(warm)) == []
    after = run_world(rankfns.all_reduce_steps, world_size=3)
    assert not after.warm and set(_pids(after)).isdisjoint(_pids(warm))


@pytest.mark.parametrize("what", ["group", "no_grad", "dtype", "thread", "workers", "collective"])
def test_a_rank_that_left_state_behind_is_never_reused(what):
    result = run_world(rankfns.leave_state_behind, world_size=2, args=(what,))
    assert result.outcome == "completed" and not result.reused
    assert alive(result.values) == []
    assert any(e.get("leftovers") for r in result.ranks for e in r.events if e["k"] == "finished")


def test_opt_out_by_argument_and_by_environment(monkeypatch):
    assert not run_world(rankfns.all_reduce_steps, world_size=2, reuse=False).reused
    monkeypatch.setenv("DDPFAULTS_REUSE", "0")
    assert not run_world(rankfns.all_reduce_steps, world_size=2).reused
    assert pool.warm_pids() == []


def test_closing_the_pool_leaves_nothing_and_takes_no_time():
    import time

    result = run_world(rankfns.all_reduce_steps, world_size=4)
    assert sorted(pool.warm_pids()) == sorted(_pids(result))
    t0 = time.monotonic()
    pool.close_all()
    assert time.monotonic() - t0 < 2.0
    assert census.survivors(_pids(result)) == [] and pool.warm_pids() == []


def test_memory_of_a_warm_world_stays_flat_over_many_runs():
    first = run_world(rankfns.rss_kib, world_size=2)
    for _ in range(30):
        last = run_world(rankfns.rss_kib, world_size=2)
    assert last.warm and _pids(last) == _pids(first)
    growth = [b - a for a, b in zip(first.values, last.values, strict=True)]
    assert max(growth) < 20_000, f"rank RSS grew by {growth} KiB over 30 runs"


def test_warm_ranks_die_with_the_launcher_at_exit(tmp_path):
    script = tmp_path / "launcher.py"
    script.write_text(
        textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {SUPPORT!r})
        import rankfns
        from ddpfaults import run_world
        from ddpfaults.engine import pool
        if __name__ == "__main__":
            result = run_world(rankfns.all_reduce_steps, world_size=3)
            assert result.reused
            print(" ".join(map(str, pool.warm_pids())))
    """)
    )
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    pids = [int(p) for p in run.stdout.split()]
    assert len(pids) == 3 and alive(pids) == []
