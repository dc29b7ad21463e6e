"""Start-up is judged by its own limit, never by the stall rule; a verdict never rests on a stale stack or on a
failed rank that has not exited yet."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import time
import types
from multiprocessing.reduction import ForkingPickler

import pytest

import rankfns
from ddpfaults import Outcome, run_script, run_world
from ddpfaults.engine import pool
from ddpfaults.engine.launcher import LocalWorld
from ddpfaults.judge.live import loop
from ddpfaults.judge.live.watch import RankWatch
from ddpfaults.proc.tree import runnable
from ddpfaults.rank import forkserver
from ddpfaults.spec import RunSpec
from processes import EVENT_GUARD, WORLD_GUARD

SCRIPTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support", "scripts")
BAD = os.path.join(SCRIPTS, "bad_scripts.py")


def test_a_rank_that_never_joins_is_named_at_the_start_up_limit(fork_server):
    # fixed: the start-up limit this test checks is reached (a rank never joins); stall 1 s: the others wait
    result = run_script(BAD, ["rank_1_never_joins"], world_size=3, startup=4, stall=1, timeout=WORLD_GUARD)
    assert result.outcome == "hung"
    assert result.reason == "start-up not finished after 4 s (not every rank joined the process group)"
    assert result.root_rank == 1
    assert result.root_cause.startswith("rank 1 never joined the process group during start-up (rank 1 at ")
    assert (
        "bad_scripts.py" in result.root_cause and "while ranks 0, 2 waited in init_process_group" in result.root_cause
    )
    assert [r.where for r in result.ranks if r.rank != 1] == [
        "in init_process_group() at bad_scripts.py:25 in <module>"
    ] * 2
    assert result.elapsed < 4 + 3  # judged at the limit (plus stacks), not at the timeout
    # fixed: the start-up limit given above, read back from the replay line
    assert "--startup 4 " in result.replay


@pytest.mark.slow
def test_a_script_whose_imports_take_40_cpu_seconds_completes_with_the_default_settings(fork_server):
    """As importing transformers does under load: each rank computes for 40 s of its own CPU before it joins; no
    setting is given, so the defaults must let it start, however starved the machine is."""
    result = run_script(os.path.join(SCRIPTS, "slow_imports.py"), ["40"], world_size=2)
    assert result.outcome == Outcome.COMPLETED, result.report()
    assert result.elapsed >= 40, result.report()


def _world(watches) -> LocalWorld:
    world = LocalWorld(work=None, faults=(), spec=RunSpec())
    world.watches = watches
    return world


def test_a_failed_rank_still_exiting_counts_as_failing_now():
    # gloo tells the peers only when the failed process is gone: until then, its peers' wait is no hang
    failed, exited, running = (RankWatch(r, "/nonexistent") for r in range(3))
    failed._apply({"k": "failed", "error": "SystemExit: 0", "site": "x", "step": 2})
    exited.exit_time = 12.0
    assert _world([failed, exited, running]).failures_seen(20.0) == [20.0, 12.0]


def test_a_stack_dump_that_does_not_come_leaves_the_stack_unknown_not_stale(tmp_path, monkeypatch):
    # the process serves no stack request (it has no request thread): the dump never comes
    # fixed: the judge's guard on an answer, cut short: no answer comes however long it waits
    monkeypatch.setattr(loop, "ANSWER_GUARD", 0.5)
    # fixed: stands for "never returns": the test ends it (a signal, a kill, the judge) long before
    silent = "import time; print(1, flush=True); time.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-c", silent], stdout=subprocess.PIPE)
    try:
        proc.stdout.readline()  # it is running
        watch = RankWatch(0, str(tmp_path))
        watch.events = [{"k": "start"}]
        watch.stack = 'File "x.py", line 1 in all_reduce'  # from an earlier dump
        world = _world([watch])
        world.ranks = types.SimpleNamespace(procs=[types.SimpleNamespace(pid=proc.pid, exitcode=None)])
        world.dir = str(tmp_path)
        world.collect_stacks([0])
        assert watch.stack is None
    finally:
        proc.kill()
        proc.wait()


def test_a_rank_calling_sys_exit_is_a_crash_every_time():
    # judged hung in 1 run of 5 once: its peers' wait was taken for a hang while the failed rank was still exiting
    for _ in range(5):
        # fixed: a short stall a crashing world must not trip: the regression this test guards against
        result = run_world(rankfns.exit_zero_at, world_size=2, stall=1, timeout=WORLD_GUARD)
        assert result.outcome == "crashed", result.report()
        assert result.root_rank == 1 and result.root_cause.startswith("rank 1 raised SystemExit: 0"), result.report()


def test_runnable_tells_a_computing_process_from_a_sleeping_one():
    started = "import time\nprint(1, flush=True)\n"
    spinning = subprocess.Popen([sys.executable, "-c", started + "while True: pass"], stdout=subprocess.PIPE)
    # fixed: stands for "never returns": the test ends it (a signal, a kill, the judge) long before
    sleeping = subprocess.Popen([sys.executable, "-c", started + "time.sleep(60)"], stdout=subprocess.PIPE)
    try:
        for proc in (spinning, sleeping):
            proc.stdout.readline()  # past its start-up, however long the machine's load makes it
        assert runnable(spinning.pid, samples=20)
        deadline = time.monotonic() + EVENT_GUARD
        while runnable(sleeping.pid) and time.monotonic() < deadline:
            # fixed: the poll interval: the event ends the wait, this only spaces the looks
            time.sleep(0.01)  # from print to sleep: one statement, once the loaded machine gives it the CPU
        assert not any(runnable(sleeping.pid) for _ in range(20))  # asleep: never runnable again
        assert runnable(spinning.pid, samples=20)
    finally:
        for proc in (spinning, sleeping):
            proc.kill()
            proc.wait()


def test_a_rank_never_started_is_not_live():
    # LocalWorld.run marks the live ranks it kills with a "killed" event: never one that never started
    # fixed: a value handed to a pure function or refused before any world starts: no real time passes
    ranks = pool.RankSet(world_size=2, backend="gloo", start_method="forkserver", threads=1, timeout=10, warm=False)
    try:
        ranks.procs = [types.SimpleNamespace(pid=os.getpid(), exitcode=None), pool.Unstarted()]
        assert ranks.live() == [0]
    finally:
        ranks.procs = []
        ranks.close()


def test_a_rank_forked_from_the_fork_server_never_walks_the_preloaded_objects_in_a_collection():
    """The fork server freezes what its preload made (``ddpfaults.rank.preload_done``): a rank inherits torch's
    objects in the permanent generation, so no full collection in the rank walks (and copies on write) them."""
    result = run_world(rankfns.frozen_objects, world_size=2)
    assert result.outcome == Outcome.COMPLETED, result.report()
    assert all(count > 100_000 for count in result.values), result.values


def test_the_fork_server_probe_pickles_by_name_whatever_replaced_os_exit(monkeypatch):
    """coverage.py (``patch = _exit``) replaces ``os._exit`` with a local function: a probe whose target was
    ``os._exit`` failed to pickle, so the fork server was never probed and its first world waited for it instead."""

    def local_exit(code):
        raise AssertionError("not called")

    monkeypatch.setattr(os, "_exit", local_exit)
    with pytest.raises(AttributeError, match="local object"):
        ForkingPickler.dumps(os._exit)  # what the probe's process object carried
    assert pickle.loads(ForkingPickler.dumps(pool.forkserver_probe)) is forkserver.probe
