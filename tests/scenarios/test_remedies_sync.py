"""ddpfaults.remedies.any_rank and sync_metrics in real gloo worlds (Lightning #12190, #19106)."""

import pytest

from ddpfaults import remedies, run_world


def any_flag(ctx, flagged):
    """Each rank reports whether any rank's flag is set, its own being ``rank in flagged``."""
    return remedies.any_rank(ctx.rank in flagged)


def sync(ctx, logs):
    """Rank r syncs its own metrics ``logs[r]``."""
    return remedies.sync_metrics(logs[ctx.rank])


@pytest.mark.parametrize("flagged, expected", [((), False), ((2,), True), ((0, 1, 2), True)])
def test_any_rank_is_the_same_answer_on_every_rank(flagged, expected):
    result = run_world(any_flag, world_size=3, kwargs={"flagged": flagged})
    assert result.outcome == "completed", result.report()
    assert result.values == [expected] * 3


def test_sync_metrics_averages_each_key_over_the_ranks_that_logged_it():
    logs = [{"loss": 1.0, "acc": 0.5}, {"loss": 3.0}, {"loss": 5.0, "acc": 1.0, "empty": 2.0}]
    result = run_world(sync, world_size=3, kwargs={"logs": logs})
    assert result.outcome == "completed", result.report()
    assert result.values == [{"acc": 0.75, "empty": 2.0, "loss": 3.0}] * 3


def test_sync_metrics_of_no_keys_anywhere_is_empty():
    result = run_world(sync, world_size=2, kwargs={"logs": [{}, {}]})
    assert result.outcome == "completed", result.report()
    assert result.values == [{}, {}]
