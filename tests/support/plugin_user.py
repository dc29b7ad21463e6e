"""The user's files of the plugin's end-to-end tests (rank function modules, a scenario module, test modules using
the ``ddp_world`` fixture) and the sessions that run them once per test run, each checked in parts by tests in
several modules (tests/plugin/test_plugin.py, tests/report/test_chrome_trace.py, tests/engine/test_faults_fire.py)."""

from pluginruns import assert_no_orphans, run_once

STEPS = '''
import os
import time

import torch
import torch.distributed as dist


def steps(ctx, steps=3):
    """All-reduce a ones tensor once per step."""
    t = torch.ones(1)
    for step in range(steps):
        ctx.step(step)
        dist.all_reduce(t)
    return float(t)


def idle(ctx, directory):
    """Write this rank's pid into ``directory``, then sleep forever outside any collective: not waiting on a peer,
    never hung by the stall rule; hung when the hard timeout comes (it wants a core a thousandth of the time: not
    computing); and no CPU taken from the tests running beside it."""
    with open(os.path.join(directory, f"rank{ctx.rank}.pid"), "w") as f:
        f.write(str(os.getpid()))
    ctx.step(0)
    while True:
        # fixed: an idle rank's nap: it idles until the test ends it
        time.sleep(0.05)
'''

SCENARIOS = '''
import ddpfaults
from ddpfaults.faults import RankCrash, SkippedCollective
from rankfns_user import steps


@ddpfaults.scenario(world_size=2, expect="completed")
def completes(ctx):
    """Two ranks all-reduce three times."""
    return steps(ctx)


# fixed: the stall window of the hang this test expects; load calls none sooner (a starved rank is computing)
@ddpfaults.scenario(world_size=2, stall=0.5, faults=[SkippedCollective(rank=1, step=1)], expect="completed")
def skips_a_collective(ctx):
    """Rank 1 skips step 1's all_reduce: the world hangs, but this scenario claims it completes."""
    return steps(ctx)


@ddpfaults.scenario(world_size=2, faults=[RankCrash(rank=1, step=1, exc=KeyError("mask"))], variants=[
    ddpfaults.variant("exit", expect="crashed with KeyError on rank 1"),
    ddpfaults.variant("claims_completed", expect="completed"),
])
def crashes(ctx):
    """Rank 1 raises KeyError at step 1."""
    return steps(ctx)
'''


def every_option_session(tmp_path_factory):
    """The four scenario_user items run once per test run, with two xdist workers, a JUnit XML file, the HTML page,
    the Chrome trace and flight-recorder dumps: (result, report document, session directory). Plugin autoload is
    off, so the session also shows ``-p ddpfaults`` (and ``-p xdist.plugin``) loading what it needs."""
    result, document, directory = run_once(
        tmp_path_factory,
        "every_option",
        {"rankfns_user": STEPS, "scenario_user": SCENARIOS},
        "-p",
        "xdist.plugin",
        "-n",
        "2",
        "--junitxml=junit.xml",
        "--ddpfaults-html=out/worlds.html",
        "--ddpfaults-trace=out/trace.json",
        "--ddpfaults-flight-recorder=fr",
        env={"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"},
    )
    assert_no_orphans(document)
    return result, document, directory


#: tests using the ddp_world fixture and the marker (checked in tests/plugin/test_plugin.py)
WORLDS_TESTS = """
import pytest
import rankfns_user
from ddpfaults.faults import SkippedCollective

# fixed: a setting read back from the marker (asserted): the world completes
@pytest.mark.ddpfaults(world_size=3, stall=0.5, seed=5)
def test_marker(ddp_world):
    result = ddp_world.run(rankfns_user.steps)
    assert (result.world_size, result.stall, result.seed) == (3, 0.5, 11)  # --ddpfaults-seed beats the marker
    assert result.values == [27.0] * 3

def test_asserted_hang(ddp_world):
    # fixed: the stall window of the hang this test expects; load calls none sooner (a starved rank is computing)
    result = ddp_world.run(rankfns_user.steps, world_size=2, stall=0.5, faults=[SkippedCollective(rank=0, step=1)])
    assert result.outcome == "completed"

def test_expected_hang(ddp_world):
    # fixed: the stall window of the hang this test expects; load calls none sooner (a starved rank is computing)
    ddp_world.run(rankfns_user.steps, world_size=2, stall=0.5, faults=[SkippedCollective(rank=0, step=1)],
                  expect="hung in all_reduce")
"""

#: tests whose fault never fires (checked in tests/engine/test_faults_fire.py)
FIRE_TESTS = """
import rankfns_user
from ddpfaults.faults import RankCrash


def test_unfired(ddp_world):
    ddp_world.run(rankfns_user.steps, world_size=2, faults=[RankCrash(rank=1, step=9)])


def test_allowed(ddp_world):
    plan = [RankCrash(rank=1, step=9)]
    result = ddp_world.run(rankfns_user.steps, world_size=2, faults=plan, require_faults_fire=False)
    assert result.unfired[0].finished == (1,)


def test_expected(ddp_world):
    ddp_world.run(rankfns_user.steps, world_size=2, faults=[RankCrash(rank=1, step=9)], expect="completed")
"""


def ddp_world_session(tmp_path_factory):
    """test_worlds.py and test_fixture.py run once per test run with ``-v --ddpfaults-show --ddpfaults-seed=11``:
    (result, report document, session directory)."""
    result, document, directory = run_once(
        tmp_path_factory,
        "ddp_world",
        {"rankfns_user": STEPS, "test_worlds": WORLDS_TESTS, "test_fixture": FIRE_TESTS},
        "test_worlds.py",
        "test_fixture.py",
        "-v",
        "--ddpfaults-show",
        "--ddpfaults-seed=11",
    )
    assert_no_orphans(document)
    return result, document, directory
