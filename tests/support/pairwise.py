"""Parameters for tests whose worlds vary along three factors: every pair of values of any two factors in some
row (pairwise coverage), in half the rows of the full product (which is kept for the deep runs)."""

from __future__ import annotations

import os

import pytest

#: run the full product instead (``FULL_PRODUCT=1``), as the Hypothesis ``deep`` profile does for properties
FULL = os.environ.get("FULL_PRODUCT") == "1"


def pairwise(first, second, third) -> list:
    """Rows ``(a, b, c)`` with ``a`` from ``first`` and ``b``, ``c`` from the two-valued ``second`` and ``third``: every
    ``a`` meets each ``b`` and each ``c``, and each ``b`` each ``c`` (``c`` alternates with ``a``'s index and ``b``'s,
    so a ``first`` of two or more values covers every pair), as ``pytest.param`` rows with ids ``a-b-c``."""
    if len(second) != 2 or len(third) != 2 or len(first) < 2:
        raise ValueError("pairwise: the second and third factors take two values each, the first two or more")
    rows = [
        (a, b, c)
        for i, a in enumerate(first)
        for j, b in enumerate(second)
        for c in ([third[(i + j) % 2]] if not FULL else third)
    ]
    return [pytest.param(*row, id="-".join(str(v) for v in row)) for row in rows]
