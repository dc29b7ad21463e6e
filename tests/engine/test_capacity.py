"""A local world larger than the machine can hold is refused before any process starts, naming the limit."""

from __future__ import annotations

import os

import pytest

import ddpfaults
from ddpfaults.engine import capacity, census
from ddpfaults.errors import InvalidWorldSize
from processes import WORLD_GUARD
from rankfns import all_reduce_steps

PLAIN = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support", "scripts", "plain_train.py"
)


def test_the_limit_is_the_smallest_budget_and_the_message_says_how_each_is_derived():
    measured = dict(mem_available=10 * 2**30, free_tasks=800, free_fds=1000)
    assert {name: ranks for name, (ranks, _) in capacity.budgets(**measured).items()} == {
        "memory": 160,
        "tasks": 100,
        "file descriptors": 250,
    }
    capacity.check_world_size(100, **measured)
    with pytest.raises(InvalidWorldSize) as info:
        capacity.check_world_size(101, **measured)
    assert str(info.value) == (
        "world_size=101 is more than this machine can hold: at most 100 ranks here (memory: 10.0 GiB available / "
        "64 MiB per rank = 160; tasks: 800 free kernel tasks / 8 per rank = 100; file descriptors: 1000 free file "
        "descriptors / 4 per rank in the launcher = 250)"
    )


def test_this_machine_has_room_for_the_worlds_the_suite_runs():
    assert min(ranks for ranks, _ in capacity.budgets().values()) >= 16


@pytest.mark.parametrize("run", [ddpfaults.run_world, ddpfaults.run_script])
def test_a_world_beyond_the_machine_is_refused_before_anything_starts(run):
    launched = list(census.LAUNCHED)
    target = all_reduce_steps if run is ddpfaults.run_world else PLAIN
    with pytest.raises(InvalidWorldSize, match=r"world_size=1000000 is more than this machine can hold: at most \d+"):
        run(target, world_size=1_000_000, timeout=WORLD_GUARD)
    assert census.LAUNCHED == launched
