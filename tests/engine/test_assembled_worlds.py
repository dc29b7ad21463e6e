"""Every result a real world hands over is assembled (tests/judge/test_assembled.py has the rule): a world's, and a
restarted world's, whose attempts are merged into a new one."""

import dataclasses

import pytest

import ddpfaults
import rankfns
import restartfns
from ddpfaults.faults import RankKilled


def test_a_world_s_result_and_a_restarted_world_s_refuse_a_change():
    # fixed: a long stall: no hang is expected; load never makes every rank wait (a starved rank computes)
    plain = ddpfaults.run_world(rankfns.all_reduce_steps, world_size=2, stall=10)
    restarted = ddpfaults.run_world(
        restartfns.counting,
        world_size=2,
        faults=[RankKilled(rank=1, step=2)],
        max_restarts=1,
        # fixed: a long stall: no hang is expected; a restart's rendezvous waits are never taken for one
        stall=10,
    )
    assert (plain.outcome, restarted.outcome, len(restarted.attempts)) == ("completed", "completed", 2)
    for result in (plain, restarted):
        with pytest.raises(dataclasses.FrozenInstanceError):
            result.replay = "changed"
        with pytest.raises(dataclasses.FrozenInstanceError):
            result.outcome = "hung"
