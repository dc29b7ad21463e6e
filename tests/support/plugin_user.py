"""The user's files of the plugin's end-to-end tests (a rank function module and a scenario module), and the one
session that runs them with every report option (tests/plugin/test_plugin.py and tests/report/test_chrome_trace.py
check parts of it)."""

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
    """Write this rank's pid into ``directory``, then sleep forever outside any collective (not waiting on a peer:
    never judged hung, only timed out; and no CPU taken from the tests running beside it)."""
    with open(os.path.join(directory, f"rank{ctx.rank}.pid"), "w") as f:
        f.write(str(os.getpid()))
    ctx.step(0)
    while True:
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
