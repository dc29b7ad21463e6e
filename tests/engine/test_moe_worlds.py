"""MoE ``all_to_all_single`` in real worlds: split sizes the ranks did not agree on are checked from the sender's
side, so the rank that routed more tokens than its receiver expected is named, not the receiver gloo aborts."""

import os

import pytest

import moefns
from ddpfaults import Outcome, run_script, run_world

SCRIPTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support", "scripts")


@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("form", ["function", "script"])
def test_the_sender_of_extra_tokens_to_receivers_expecting_an_even_split_is_named(world_size, form):
    """Rank R sends 12 tokens where the others send 8, its 4 extra to expert R+1, whose even split has room for 2
    from it: gloo aborts rank R+1, and rank R is named (no rank was, or the receiver)."""
    sender = world_size - 1
    if form == "function":
        result = run_world(moefns.even_receivers, world_size=world_size, kwargs={"sender": sender})
    else:
        script = os.path.join(SCRIPTS, "moe_even_receivers.py")
        result = run_script(script, ["--sender", str(sender)], world_size=world_size)
    receiver = (sender + 1) % world_size
    assert result.outcome == Outcome.CRASHED and result.root_rank == sender, result.report()
    assert f"sent rank {receiver} 6 row(s) where rank {receiver} expected 2 from it" in result.root_cause
