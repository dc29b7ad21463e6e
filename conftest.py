"""Project-wide test set-up: every test is followed by an orphan census of the ranks it launched."""

import pytest

from ddpfaults import census

pytest_plugins = ["pytester"]


@pytest.fixture(autouse=True)
def _no_rank_survives():
    """After each test, no rank process launched by this test process (nor its children) may be alive."""
    yield
    left = census.survivors()
    assert not left, f"rank processes survived the test: {left}"
