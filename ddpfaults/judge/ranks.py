"""How a verdict writes a set of ranks (``rank 2``, ``ranks 0-8, 10-15``): shared by the verdict's texts and the
report's."""

from __future__ import annotations


def format_ranks(ranks, noun: str = "rank") -> str:
    """``rank 2`` / ``ranks 0, 1, 3`` / ``ranks 0-8, 10-15`` (runs of three or more collapsed; ``noun``: what they
    number, ``step 2`` / ``steps 0-4``)."""
    ranks = sorted(ranks)
    if len(ranks) == 1:
        return f"{noun} {ranks[0]}"
    runs, start = [], 0
    for i in range(1, len(ranks) + 1):
        if i == len(ranks) or ranks[i] != ranks[i - 1] + 1:
            run = ranks[start:i]
            runs += [f"{run[0]}-{run[-1]}"] if len(run) > 2 else [str(r) for r in run]
            start = i
    return f"{noun}s " + ", ".join(runs)
