"""Which ranks diverged, from what each rank did: pure functions over rank results (no processes, no torch).

Where the ranks' collective sequences first disagree (:func:`ddpfaults.judge.verdict.first_divergence`) says
where they split, not which side left the common path; at two ranks a vote cannot tell. The evidence, strongest
first (after the order the ranks made their process groups in, :func:`ddpfaults.judge.groups.creation_order`,
given by the caller: collectives in groups made in other orders meet crosswise, a divergence that order explains):

1. **loop exit**: ranks whose DataLoader iterator ran out after fewer batches than a peer's same iterator;
2. **own pattern**: ranks that, in one unit of their loop (a DataLoader batch where the ranks drew batches, else a
   step), made other collectives than they make in their other units, while every other rank that reached that
   unit made its usual ones (a rank that skipped a step's backward, or reduced one metric more);
3. **faults**: the only group with ranks a fault of the plan fired on, counting a fault by what it changed: one
   acting on the rank's collectives or its life (a skipped collective, a lone barrier, a crash or a kill...) always;
   one that changed a batch or cut a loader short only where the rank then made, at the fault's step, other
   collectives than its peers (its loop skipped the batch), never where it made the same (it trained on it);
4. **rank-conditional code**: the ranks standing inside a branch on their own rank (``if rank == 0:``,
   ``is_main_process()``...: :mod:`ddpfaults.judge.live.branches`) while the others stand in none, or, when most
   ranks stand inside one and the same such branch, the fewer seen outside it; when the ranks seen outside it made
   collectives inside it at earlier steps (a block every rank runs), only those that made none in it at a step where
   the ranks inside did;
5. **majority**: a single smallest group.

With none of these, no rank is named and the divergence says so.
"""

from __future__ import annotations

import collections
import dataclasses
from dataclasses import dataclass

from ddpfaults.judge.ranks import format_ranks
from ddpfaults.judge.results import NOTHING_SHOWS, POINT_TO_POINT, Collective, Divergence, RankResult, RankState


@dataclass(frozen=True)
class Evidence:
    """Ranks the evidence singles out as the ones that diverged, and what shows it (a clause for the report)."""

    ranks: tuple
    shows: str


def _by_batch(ranks: list[RankResult]) -> bool:
    """True if the ranks drew DataLoader batches: their loop's unit is the batch, else the step."""
    return any(c.batch is not None for r in ranks for c in r.collectives) or any(
        e.get("k") == "batch" for r in ranks for e in r.events
    )


def _unit_calls(rank: RankResult, by_batch: bool) -> dict[int, list[Collective]]:
    """The rank's collectives (of every process group it is in) per unit of its loop, every unit it reached included
    (those in which it made none too); collectives made before its first unit are left out."""
    units: dict[int, list[Collective]] = collections.defaultdict(list)
    for call in rank.collectives:
        unit = call.batch if by_batch else call.step
        if unit is not None and call.op not in POINT_TO_POINT:
            units[unit].append(call)
    kind = "batch" if by_batch else "step"
    reached = {e[("index" if by_batch else "step")] for e in rank.events if e.get("k") == kind}
    reached |= set(units)
    if not by_batch and rank.last_step is not None:
        reached.add(rank.last_step)
    if reached:
        for unit in range(min(reached), max(reached) + 1):
            units.setdefault(unit, [])
    return dict(units)


def _signature(call: Collective) -> tuple:
    """What a call is, wherever in the loop it comes: its signature without the step."""
    return call.signature()[:4]


def _once(calls: dict[int, dict[int, list[Collective]]]) -> set:
    """The calls no rank makes in more than one unit: set-up and wind-down (DDP rebuilding its buckets in its second
    forward, a closing barrier), not part of the loop's pattern. Some ranks' records lack them altogether (a rank
    gloo aborted has only ddpfaults' tracing, which does not see DDP's own calls)."""
    most: dict[tuple, int] = collections.defaultdict(int)
    for units in calls.values():
        counts = collections.Counter(s for cs in units.values() for s in {_signature(c) for c in cs})
        for signature, n in counts.items():
            most[signature] = max(most[signature], n)
    return {s for s, n in most.items() if n == 1}


#: complete units a rank's usual pattern must be seen in (one unit, say a step every rank skipped, is no habit)
HABIT = 2


def _usual(patterns: dict[int, tuple], complete: list[int], unit: int) -> tuple | None:
    """The pattern the rank made in every complete unit other than ``unit``; None if they differ (a loop that
    syncs every other step has no usual unit to depart from) or there are fewer than :data:`HABIT`."""
    others = [patterns[u] for u in complete if u != unit]
    return others[0] if len(others) >= HABIT and len(set(others)) == 1 else None


def _calls_text(calls: list[Collective]) -> str:
    """``all_reduce([36]) [DDP gradient bucket], barrier() at train.py:20 in main``: the calls without their step
    (and without a call site for calls DDP makes itself, which have none of their own)."""
    if not calls:
        return "no collective"
    texts = []
    for c in calls:
        shapes = ", ".join(str(s) for s in c.shapes)
        texts.append(f"{c.op}({shapes})" + (f" [{c.note}]" if c.note else f" at {c.site}"))
    return ", ".join(texts)


def own_pattern(ranks: list[RankResult]) -> Evidence | None:
    """The ranks that left their own pattern first (evidence 2 of the module docstring), or None.

    A rank's usual pattern is the one it made in every other complete unit (none if they differ); at the first
    unit where some ranks depart from theirs and every other rank there keeps to its own, those ranks left.
    A rank's last unit is complete only if it finished; a unit it is still in (blocked, or where it raised or
    died) departs only if what it made there so far is not how its usual units begin.
    """
    by_batch = _by_batch(ranks)
    calls = {r.rank: _unit_calls(r, by_batch) for r in ranks}
    once = _once(calls)
    calls = {
        r: {u: [c for c in cs if _signature(c) not in once] for u, cs in units.items()} for r, units in calls.items()
    }
    patterns = {r: {u: tuple(map(_signature, c)) for u, c in units.items()} for r, units in calls.items()}
    complete = {
        r.rank: sorted(u for u in calls[r.rank] if r.state == RankState.FINISHED or u < max(calls[r.rank]))
        for r in ranks
        if calls[r.rank]
    }
    found = departed(patterns, complete)
    if found is None:
        return None
    unit, deviants, steady, usual_at = found
    kind, kinds = ("DataLoader batch", "batches") if by_batch else ("step", "steps")
    first = deviants[0]
    made = _calls_text(calls[first][unit]) + ("" if unit in complete[first] else " so far")
    return Evidence(
        tuple(deviants),
        f"in {kind} {unit} {format_ranks(deviants)} made {made}, where {_possessive(deviants)} other "
        f"{kinds} made {_calls_text(calls[first][usual_at[first]])}; {format_ranks(steady)} made "
        f"{_possessive(steady)} usual ones",
    )


def departed(patterns: dict[int, dict[int, tuple]], complete: dict[int, list[int]]) -> tuple | None:
    """The first unit of the ranks' loops where some ranks departed from their own usual pattern while every other
    rank there kept to its own: ``(unit, deviants, steady, usual_at)`` (``usual_at``: a unit where each deviant made
    its usual pattern), or None. ``patterns``: what each rank made in each unit it reached (any hashable per call);
    ``complete``: each rank's units it ended (a unit it is still in departs only if what it made there so far is not
    how its usual units begin)."""
    for unit in sorted({u for units in patterns.values() for u in units}):
        deviants, steady, usual_at, present = [], [], {}, []
        for rank, units in patterns.items():
            if unit not in units:
                continue
            present.append(rank)
            usual = _usual(units, complete.get(rank, []), unit)
            made = units[unit]
            if usual is None:
                continue
            if made == usual if unit in complete[rank] else made == usual[: len(made)]:
                steady.append(rank)
                continue
            deviants.append(rank)
            usual_at[rank] = next(u for u in complete[rank] if u != unit and units[u] == usual)
        if deviants and steady and len(deviants) + len(steady) == len(present):
            return unit, deviants, steady, usual_at
    return None


def _possessive(ranks: list) -> str:
    return "its" if len(ranks) == 1 else "their"


def loop_exit(ranks: list[RankResult]) -> Evidence | None:
    """The ranks whose DataLoader iterator ran out first (evidence 1 of the module docstring), or None: at the
    first iterator (by the order the ranks began them) that some rank's ran out with fewer batches than a peer's
    same iterator yielded."""
    yielded: dict[int, dict[int, int]] = {}
    ended: dict[int, dict[int, int]] = {}
    for r in ranks:
        for e in r.events:
            if e.get("k") == "batch":
                yielded.setdefault(e["it"], {})[r.rank] = e["n"] + 1
            elif e.get("k") == "loader_end":
                ended.setdefault(e["it"], {})[r.rank] = e["yielded"]
    for it in sorted(ended):
        most = max(yielded.get(it, {}).values(), default=0)
        short = sorted(r for r, n in ended[it].items() if n < most)
        if short:
            longer = sorted(r for r, n in yielded[it].items() if n > ended[it][short[0]])
            return Evidence(
                tuple(short),
                f"{format_ranks(short)} left {_possessive(short)} loop early: {_possessive(short)} DataLoader "
                f"iterator ran out after {ended[it][short[0]]} batches, where {format_ranks(longer)} drew {most}",
            )
    return None


def branch_evidence(ranks: list[RankResult], branches: dict | None) -> Evidence | None:
    """The ranks standing inside a branch on their own rank when every other rank stands in none (evidence 4 of the
    module docstring; ``branches``: :func:`ddpfaults.judge.live.branches.find`'s, rank to
    :class:`~ddpfaults.judge.live.branches.Branch`, or None for a rank seen in the code under test in none), or
    None. When more ranks stand inside one and the same branch than are seen outside it, the block is what most
    ranks run, and the ranks seen outside it are the ones that left it (``if not (rank == 1 and step == 1):
    all_reduce(...)``); a rank not seen (dead, finished: no frame to read) counts on neither side."""
    inside = sorted(r.rank for r in ranks if (branches or {}).get(r.rank) is not None)
    if not inside or len(inside) == len(ranks):
        return None
    others = [r.rank for r in ranks if r.rank not in inside]
    seen_outside = [r for r in others if r in (branches or {})]
    if seen_outside and len(seen_outside) < len(inside) and len({branches[r] for r in inside}) == 1:
        return Evidence(
            tuple(seen_outside),
            f"{format_ranks(seen_outside)} stood outside a branch on the rank that {format_ranks(inside)} stood "
            f"inside, {branches[inside[0]].describe()}",
        )
    if len({branches[r] for r in inside}) == 1 and seen_outside:
        block = branches[inside[0]]
        ran = {r.rank: {c.step for c in r.collectives if block.holds(c.site)} for r in ranks}
        if all(ran[r] for r in seen_outside):
            return _left_the_block(ranks, inside, seen_outside, block, ran)
    return Evidence(
        tuple(inside),
        f"{format_ranks(inside)} stood inside a branch on {_possessive(inside)} rank, "
        f"{branches[inside[0]].describe()}; {format_ranks(others)} in none",
    )


def _left_the_block(ranks: list[RankResult], inside: list, outside: list, block, ran: dict) -> Evidence | None:
    """The block the ``inside`` ranks stand in is one the ``outside`` ranks ran too, at earlier steps (``ran``: each
    rank's steps with a collective made in it): no rank-specific code. The ``outside`` ranks are named where, at a
    step every ``inside`` rank made a collective in the block, each of them made collectives elsewhere and none in
    it (``if not (rank == 1 and step == 1): all_reduce(...)`` at 2 ranks: rank 1 skipped it at step 1); else None."""
    made = {r.rank: {c.step for c in r.collectives} for r in ranks}
    common = set.intersection(*(ran[r] for r in inside))
    for step in sorted(s for s in common if s is not None):
        if all(step in made[r] and step not in ran[r] for r in outside):
            before = sorted(s for s in set().union(*(ran[r] for r in outside)) if s is not None)
            who, earlier = ("it" if len(outside) == 1 else "they"), format_ranks(before, "step")
            return Evidence(
                tuple(outside),
                f"in step {step} {format_ranks(outside)} made no collective inside {block.describe()}, as {who} "
                f"did in {earlier} and {format_ranks(inside)} did in step {step}",
            )
    return None


def attribute(
    divergence: Divergence | None,
    ranks: list[RankResult],
    fired=(),
    branches: dict | None = None,
    order: Evidence | None = None,
) -> Divergence | None:
    """``divergence`` with ``odd_ranks`` (and ``basis``) set from the evidence, strongest first (the module
    docstring); ``odd_ranks`` is empty when nothing shows which ranks diverged. ``fired``: the faults that fired;
    ``branches``: the branches on their rank the ranks stand inside (:func:`branch_evidence`); ``order``: the
    ranks that made their process groups in another order (:func:`ddpfaults.judge.groups.creation_order`), which
    comes before all else: collectives in groups the ranks made in other orders meet cross-wired, so their
    divergence follows from it (naming no rank where that evidence is symmetric)."""
    if divergence is None:
        return None
    grouped = [r for g in divergence.groups for r in g.ranks]

    def whole_groups(found: Evidence | None) -> tuple:
        odd = tuple(sorted(r for r in found.ranks if r in grouped)) if found else ()
        groups = [g.ranks for g in divergence.groups if set(g.ranks) & set(odd)]
        if odd and len(odd) < len(grouped) and sum(len(g) for g in groups) == len(odd):
            return odd
        return ()

    if order is not None:
        odd = whole_groups(order)
        if odd or not order.ranks:
            return dataclasses.replace(divergence, odd_ranks=odd, basis=order.shows)
    for found in (
        loop_exit(ranks),
        own_pattern(ranks),
        _faults_on(divergence, fired, ranks),
        branch_evidence(ranks, branches),
    ):
        if odd := whole_groups(found):
            return dataclasses.replace(divergence, odd_ranks=odd, basis=found.shows)
    sizes = sorted(len(g.ranks) for g in divergence.groups)
    if len(sizes) >= 2 and sizes[0] < sizes[1]:
        smallest = min(divergence.groups, key=lambda g: len(g.ranks))
        return dataclasses.replace(divergence, odd_ranks=smallest.ranks, basis="")
    return dataclasses.replace(divergence, odd_ranks=(), basis=NOTHING_SHOWS)


def culprits(ranks: list[RankResult], fired=(), branches: dict | None = None) -> Evidence | None:
    """The ranks the evidence singles out where no divergent collective was found (a rank gloo aborted left no
    record to compare): the first of :func:`loop_exit`, :func:`own_pattern`, the only ranks a fault fired on
    (at the latest step any fired, when some ranks but not all), and :func:`branch_evidence`."""
    found = loop_exit(ranks) or own_pattern(ranks)
    if found is not None:
        return found
    fired = _evidence(fired, ranks)
    if fired:
        last = max((f.step for f in fired if f.step is not None), default=None)
        latest = [f for f in fired if f.step == last]
        hit = sorted({f.rank for f in latest})
        if len(hit) < len(ranks):
            return _fired_on(hit, latest)
    return branch_evidence(ranks, branches)


#: what a fault did (:data:`ddpfaults.events.EFFECTS`) that changes a rank's collectives only through what its own
#: code then does: evidence only where that rank's collectives at the fault's step differ from its peers'
THROUGH_THE_LOOP = frozenset({"changed_batch", "stopped_loader"})


def _evidence(fired, ranks: list[RankResult]) -> list:
    """The fired faults that are evidence: those acting on a rank's collectives or its life, and those
    :data:`THROUGH_THE_LOOP` after which the rank made, at the fault's step, other collectives than every peer
    made at that step (its loop skipped the emptied batch; one that trained on it changed nothing)."""

    def at(rank: RankResult, step) -> tuple:
        return tuple(_signature(c) for c in rank.collectives if c.step == step and c.op not in POINT_TO_POINT)

    by_rank = {r.rank: r for r in ranks}
    kept = []
    for f in fired:
        if f.effect in THROUGH_THE_LOOP:
            own = by_rank.get(f.rank)
            peers = [r for r in ranks if r.rank != f.rank and r.collectives]
            if own is None or not peers or all(at(own, f.step) == at(peer, f.step) for peer in peers):
                continue
        kept.append(f)
    return kept


def _faults_on(divergence: Divergence, fired, ranks: list[RankResult]) -> Evidence | None:
    """The only group of the divergence with ranks a fault fired on (evidence 3 of the module docstring): the faults
    that fired at the divergent calls' steps, else those that fired before them (:func:`_evidence`'s)."""
    fired = _evidence(fired, ranks)
    steps = {g.call.step for g in divergence.groups if g.call is not None and g.call.step is not None}
    if steps:
        at = [f for f in fired if f.step in steps]
        fired = at or [f for f in fired if f.step is None or f.step <= max(steps)]
    hit = {f.rank for f in fired}
    struck = [g for g in divergence.groups if hit & set(g.ranks)]
    return _fired_on(struck[0].ranks, fired) if len(struck) == 1 else None


def _fired_on(ranks, fired) -> Evidence:
    """Evidence naming ``ranks``, the only ones of the faults ``fired`` took effect on."""
    faults = sorted({f.fault for f in fired if f.rank in ranks})
    return Evidence(tuple(ranks), f"a fault fired on {format_ranks(ranks)} only: {', '.join(faults)}")
