"""The recorded worlds (tests/support/recorded.py): each reads back whole, as this version writes worlds; and, as a
slow test, each live world still gives what was recorded."""

import pytest

import recorded


def _stable(world) -> tuple:
    """What a live run of a recorded world must give again (pids, times and paths differ from run to run)."""
    fired = [(f.index, f.fault, f.rank, f.step, f.how) for f in world.fired]
    states = [str(r.state) for r in world.ranks]
    return world.outcome, world.root_rank, world.root_cause, world.divergence.describe(), fired, world.unfired, states


@pytest.mark.parametrize("name", sorted(recorded.RECORDINGS))
def test_a_recording_reads_back_as_the_world_it_recorded(name):
    document = recorded.document(name)
    world = recorded.load(name)
    assert world.to_dict() == document, f"re-record it: python tests/support/recorded.py {name}"
    world_size, skipper = recorded.RECORDINGS[name]
    assert (world.outcome, world.root_rank, world.world_size) == ("hung", skipper, world_size), world.report()
    assert [r.rank for r in world.ranks] == list(range(world_size))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["hung16", "hung64"])  # recorded.RECORDINGS, as a list test_doc_figures.py counts
def test_a_recorded_world_is_what_its_live_world_gives(name):
    assert _stable(recorded.live(name)) == _stable(recorded.load(name)), "re-record: python tests/support/recorded.py"
