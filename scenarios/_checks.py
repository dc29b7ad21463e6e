"""Checks beyond the verdict for the built-in scenarios: :class:`~ddpfaults.scenario.Check` s over
the world result (what the ranks returned, which of them survived), and the stall windows.

Used where the verdict alone cannot tell naive from fixed (a completed run that violates an
invariant; a crash whose survivors did or did not keep the last good checkpoint).
"""

from __future__ import annotations

from ddpfaults import Check, Expect

#: stall window of the variants expected to hang: short, so the suite stays fast
HANG_STALL = 1.0
#: stall window of every other variant: long, so a slow start on a loaded machine is never taken for a
#: hang (such a variant completes or crashes well before it; a regression into a hang still shows)
SAFE_STALL = 10.0


def expect(text: str, *checks: Check, **fields) -> Expect:
    """``expect("crashed with KeyError on rank 0", check, root_cause=...)``: parse the text, add fields and checks."""
    base = Expect.parse(text)
    values = {name: getattr(base, name) for name in ("outcome", "rank", "error", "collective")}
    return Expect(**{**values, **fields}, checks=tuple(checks))


def every_rank_errors(prefix: str) -> Check:
    """Every rank raised an error starting with ``prefix`` (nobody was merely collateral)."""

    def fn(result):
        bad = [f"rank {r.rank}: {r.error or r.state}" for r in result.ranks if not (r.error or "").startswith(prefix)]
        return f"not every rank raised {prefix}: {bad}" if bad else None

    return Check(f"every rank raised {prefix}", fn)


def value_check(description: str, predicate) -> Check:
    """``predicate(values)`` over the ranks' return values (``None`` for a rank that returned nothing)."""

    def fn(result):
        return None if predicate(result.values) else f"values were {result.values!r}"

    return Check(description, fn)


def raised_by(prefix: str, count: int) -> Check:
    """Exactly ``count`` ranks raised an error starting with ``prefix``; every other rank failed as collateral
    (a peer's loss: "Connection closed by peer", "Connection reset by peer"...)."""

    def fn(result):
        raised = [r.rank for r in result.ranks if (r.error or "").startswith(prefix)]
        others = [
            f"rank {r.rank}: {r.error or r.state}" for r in result.ranks if r.rank not in raised and not r.collateral
        ]
        if len(raised) != count or others:
            return f"ranks {raised} raised {prefix} (expected {count}); not collateral: {others}"
        return None

    return Check(f"{count} rank(s) raised {prefix}, every other rank collateral", fn)


def others_blocked_in(op: str, root: int) -> Check:
    """Every rank but ``root`` is blocked inside the collective ``op`` (where a peer of a lingering failed rank
    waits: the judge names no divergent collective when the root rank raised outside any collective)."""

    def fn(result):
        bad = [
            f"rank {r.rank}: {r.state} {r.where}"
            for r in result.ranks
            if r.rank != root and not (r.state == "blocked" and (r.where or "").startswith(f"in {op}("))
        ]
        return f"not blocked in {op}: {bad}" if bad else None

    return Check(f"every rank but {root} blocked in {op}", fn)


def _digests(result):
    return [
        next((line for line in r.output.splitlines() if line.startswith("replica digest:")), None) for r in result.ranks
    ]


#: a script returns no value: each prints its replica's digest, and every rank's must be there and equal
REPLICAS_EQUAL = Check(
    "every rank printed the same replica digest",
    lambda r: None if None not in _digests(r) and len(set(_digests(r))) == 1 else f"digests: {_digests(r)}",
)
