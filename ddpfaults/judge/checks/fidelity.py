"""How a verdict measures up, from a world's result alone (pure functions over its data; no processes, no torch):
when the failure it judged formed, how long the judge took from there to its verdict, and whether its first
divergence names what was expected.

Every time is in seconds since the world's start, the clock of the result's events (``t``).
"""

from __future__ import annotations

from ddpfaults.judge.results import Divergence, Outcome, RankResult, RankState, WorldResult

#: the events that end a rank's part in the world, the first of which dates its end
ENDS = ("finished", "failed", "exited")


def verdict_time(world: WorldResult) -> float:
    """When the world was judged: its ``verdict`` event's ``t`` (its ``elapsed`` without one)."""
    return next((e["t"] for e in world.events if e.get("k") == "verdict"), world.elapsed)


def formed_at(world: WorldResult) -> float | None:
    """When the failure the verdict judged formed (None for a completed or timed-out world, or without the times):

    - crashed: the first failure that is not collateral (``failed_at``; the first of all when every one is);
    - hung: the moment the last rank took its final place (:func:`settled_at`, the latest over the ranks): the
      deadlock formed then, whatever the judge did afterwards (waited a stall window, or proved it at once).
    """
    if world.outcome == Outcome.CRASHED:
        failed = [r for r in world.ranks if r.failed_at is not None]
        own = [r.failed_at for r in failed if not r.collateral]
        return min(own or [r.failed_at for r in failed], default=None)
    if world.outcome == Outcome.HUNG:
        until = verdict_time(world)
        times = [settled_at(r, until) for r in world.ranks]
        return max((t for t in times if t is not None), default=None)
    return None


def settled_at(rank: RankResult, until: float) -> float | None:
    """When ``rank`` took the place it held at the verdict (at ``until``; later events are the verdict's own): the
    first of its ``finished``/``failed``/``exited`` events for a rank that ended; for a blocked rank, its blocking
    ``enter`` (one it never left) or, blocked in a collective only torch's flight recorder saw (DDP's own), when
    that collective was issued; else (a rank running outside collectives, or nothing better known) its last
    event."""
    events = [e for e in rank.events if isinstance(e.get("t"), (int, float)) and e["t"] <= until]
    ended = [e["t"] for e in events if e.get("k") in ENDS]
    if ended:
        return min(ended)
    if RankState(rank.state) in (RankState.RAISED, RankState.DIED) and rank.failed_at is not None:
        return rank.failed_at
    if RankState(rank.state) == RankState.BLOCKED:
        left = {e.get("seq") for e in events if e.get("k") == "exit"}
        waiting = [e["t"] for e in events if e.get("k") == "enter" and e.get("seq") not in left]
        if waiting:
            return max(waiting)
        issued = [_world_time(rank, c.wall) for c in rank.collectives if not c.done]
        issued = [t for t in issued if t is not None and t <= until]
        if issued:
            return max(issued)
    return max((e["t"] for e in events if e.get("k") != "killed"), default=None)


def _world_time(rank: RankResult, wall: float | None) -> float | None:
    """A wall-clock time (the flight recorder's) on the world's clock, by the rank's latest event at or before it
    that carries both clocks (None: no such event, or no time)."""
    if wall is None:
        return None
    pairs = [(e["wall"], e["t"]) for e in rank.events if "wall" in e and "t" in e and e["wall"] <= wall]
    if not pairs:
        return None
    ref_wall, ref_t = max(pairs)
    return ref_t + (wall - ref_wall)


def verdict_latency(world: WorldResult) -> float | None:
    """Seconds from the failure forming (:func:`formed_at`) to the verdict (None where nothing formed)."""
    formed = formed_at(world)
    return None if formed is None else max(0.0, verdict_time(world) - formed)


def divergence_matches(divergence: Divergence | None, rank: int | None, collective: str | None) -> bool:
    """True if ``divergence`` exists, names ``rank`` among the ranks at fault (any, for None) and ``collective``
    among the ops made at the divergent position (any, for None)."""
    if divergence is None:
        return False
    return (rank is None or rank in divergence.odd_ranks) and (collective is None or collective in divergence.ops())
