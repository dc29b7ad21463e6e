"""tests/support/pairwise.py: every pair of values of any two factors meets in some row, in half the full product."""

import itertools

import pytest

import pairwise as pairwise_module
from pairwise import pairwise


@pytest.mark.parametrize("first", [["a", "b"], ["a", "b", "c"], ["counter", "data", "rng", "scheduler"]])
def test_every_pair_of_any_two_factors_is_in_some_row(first, monkeypatch):
    monkeypatch.setattr(pairwise_module, "FULL", False)  # the half product, whatever FULL_PRODUCT says
    rows = [param.values for param in pairwise(first, [2, 4], ["script", "function"])]
    assert len(rows) == 2 * len(first) == len(set(rows))
    for x, y in itertools.combinations(range(3), 2):
        wanted = {(u, v) for u in {r[x] for r in rows} for v in {r[y] for r in rows}}
        assert wanted == {(r[x], r[y]) for r in rows}, (x, y)


def test_factors_it_cannot_cover_in_half_are_refused():
    with pytest.raises(ValueError, match="two values each"):
        pairwise(["a", "b"], [2, 4, 8], ["script", "function"])
