"""Worlds set up by ``init_device_mesh`` alone: c10d's default group is what makes a world distributed, however it
was made (DeviceMesh calls c10d's ``init_process_group`` through its own reference, bound at its import)."""

import os

import pytest

import meshfns
from ddpfaults import Outcome, run_script, run_world

SCRIPTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support", "scripts")


@pytest.mark.parametrize("world_size", [2, 4])
def test_a_script_set_up_by_init_device_mesh_alone_completes(world_size):
    """It was "CRASHED ... ended on rank 0 without initialising a process group (init_process_group was never
    called)" though every rank printed "done"."""
    result = run_script(os.path.join(SCRIPTS, "mesh_only.py"), world_size=world_size)
    assert result.outcome == Outcome.COMPLETED, result.report()
    assert all(r.output.strip().endswith(f"done {float(world_size**3)}") for r in result.ranks), result.report()
    for rank in result.ranks:  # the mesh's init_process_group is traced as the wait on the peers it is
        entered = [e for e in rank.events if e.get("k") == "enter" and e.get("op") == "init_process_group"]
        assert len(entered) == 1 and "mesh_only.py:" in entered[0]["site"], rank.events


@pytest.mark.parametrize("world_size", [2, 4])
def test_a_function_set_up_by_init_device_mesh_completes(world_size):
    result = run_world(meshfns.mesh_only, world_size=world_size)
    assert result.outcome == Outcome.COMPLETED, result.report()
    assert result.values == [float(world_size**3)] * world_size


GROUPS = os.path.join(SCRIPTS, "groups_four_ways.py")
WAYS = ["new_group_timeout", "members_only", "mesh", "nn_functional"]


@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("way", WAYS)
def test_groups_made_the_ways_real_code_makes_them_show_no_divergence(world_size, way):
    """A group is its members, not torch's per-process name: a completed world whose groups were made any of these
    ways reports no divergent collective."""
    result = run_script(GROUPS, ["--way", way], world_size=world_size)
    assert result.outcome == Outcome.COMPLETED, result.report()
    assert result.divergence is None and result.desync is None, result.report()


@pytest.mark.parametrize("way", WAYS)
def test_a_rank_skipping_an_all_reduce_of_its_tp_group_is_named(way):
    """Rank 3 skips step 2's all_reduce of its tp group (ranks 2, 3): it departs from what it did at every earlier
    step, while rank 2 keeps to its own."""
    result = run_script(GROUPS, ["--way", way, "--skip-rank", "3"], world_size=4)
    assert result.outcome in (Outcome.HUNG, Outcome.CRASHED) and result.root_rank == 3, result.report()
