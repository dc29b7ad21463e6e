"""The first divergent collective of a world, from what its ranks left: torch's flight-recorder dumps (a rank
killed by a signal leaves none), ddpfaults' tracing (every rank has it, but it misses what DDP and libraries call
themselves), and where gloo aborted the ranks that left no record (their dying stacks, the sizes gloo's size check
read). Pure data over :class:`~ddpfaults.judge.results.RankResult` values: no process is touched here.
"""

from __future__ import annotations

import dataclasses
import re

from ddpfaults.judge import flight
from ddpfaults.judge.results import Divergence, DivergenceGroup, RankResult
from ddpfaults.judge.verdict import first_divergence, gloo_aborted


def first_divergence_found(ranks: list[RankResult], recorded: list[list]):
    """The first divergent collective: from torch's flight recorder, over the ranks that left a dump (a rank
    killed by a signal leaves none; one gloo aborted is counted as having left none: a dump it answered before, on
    the judge's request, can end before the collective it died in); failing that, from ddpfaults' tracing, which
    every rank has but which misses what DDP and libraries call themselves; failing both, the records set beside
    where gloo aborted the ranks that left none. The ranks compared keep the record the divergence was found in (the
    two number collectives differently)."""
    having = [i for i, record in enumerate(recorded) if record and not gloo_aborted(ranks[i])]
    unrecorded = [rank for rank in ranks if rank.rank not in having]
    divergence = None
    if len(having) >= 2:
        divergence = first_divergence([dataclasses.replace(ranks[i], collectives=recorded[i]) for i in having])
    if unrecorded and divergence is not None and len({len(g.ranks) for g in divergence.groups}) == 1:
        # the survivors' records split evenly (rank 0 vs rank 2, rank 1 aborted by gloo without a dump): which rank
        # happened to leave a dump must not decide the blame (docs/measurements.md)
        divergence = _placed_by_stack(divergence, unrecorded)
    if unrecorded:
        traced = first_divergence(ranks)
        if divergence is None and traced is None and having:
            # rank 0's record alone (gloo aborted both receivers first) blamed rank 1 (docs/measurements.md)
            divergence = _beside_aborted(recorded, having, unrecorded)
        if divergence is None:
            return traced
        if traced is not None and traced.odd_ranks != divergence.odd_ranks and all(map(_traces_buckets, ranks)):
            # a rank left no dump (killed by a signal: gloo aborts whichever receiver first saw the mismatch), so
            # the recorder compared only the survivors, and which rank gloo aborted decided the odd group; tracing
            # that saw every rank's gradient buckets (ctx.ddp) compared them all
            return traced
    for i in having:
        ranks[i].collectives, ranks[i].recorder = recorded[i], "flight recorder"
    return divergence


def _placed_by_stack(divergence, unrecorded: list[RankResult]):
    """An even split among incomplete records, completed: each rank without a record joins the group whose call
    site its last stack shows (gloo aborts a rank inside the collective it was making); the smallest group is then
    odd. None when that leaves no single smallest group."""
    members = [list(g.ranks) for g in divergence.groups]
    for rank in unrecorded:
        site = flight.stack_site(rank.stack)
        matches = [i for i, g in enumerate(divergence.groups) if site and g.call is not None and g.call.site == site]
        if len(matches) == 1:
            members[matches[0]].append(rank.rank)
    groups = _one_smallest(
        dataclasses.replace(g, ranks=tuple(sorted(m))) for g, m in zip(divergence.groups, members, strict=True)
    )
    return groups and dataclasses.replace(divergence, groups=groups, odd_ranks=groups[-1].ranks)


def _beside_aborted(recorded: list[list], having: list[int], unrecorded: list[RankResult]):
    """Agreeing records' last collective, set beside the call sites where gloo aborted the ranks without a record
    (``verdict.gloo_aborted``: it aborts a receiver inside the collective it was making, before it can dump): ranks
    at the record's call site join it, the others group by the site they died at; the smallest group is odd. None
    unless every unrecorded rank was aborted so and one group is the single smallest. A rank that left no stack (it
    died of SIGSEGV in gloo's abort) joins the aborted ranks that read the same sizes in the same size check, if
    they all died at one site."""
    lasts = [recorded[i][-1] for i in having]
    if len({(c.signature(), c.site, c.seq) for c in lasts}) != 1:
        return None
    sites: dict = {lasts[0].site: list(having)}
    read: dict = {}  # the sizes a size check read -> the sites of the ranks that read them
    unplaced = []
    for rank in unrecorded:
        site = flight.stack_site(rank.stack)
        if not gloo_aborted(rank):
            return None
        if site is None:
            unplaced.append(rank)
            continue
        sites.setdefault(site, []).append(rank.rank)
        read.setdefault(_sizes_read(rank), set()).add(site)
    for rank in unplaced:
        alike = read.get(_sizes_read(rank), set()) if _sizes_read(rank) else set()
        if len(alike) != 1:
            return None
        sites[next(iter(alike))].append(rank.rank)
    groups = _one_smallest(
        DivergenceGroup(tuple(sorted(members)), lasts[0])
        if site == lasts[0].site
        else DivergenceGroup(tuple(sorted(members)), None, f"gloo aborted them in a collective at {site}")
        for site, members in sites.items()
    )
    return groups and Divergence(lasts[0].seq, groups, groups[-1].ranks)


def _sizes_read(rank: RankResult) -> tuple | None:
    """The sizes gloo's size check compared when it aborted ``rank`` (``op.preamble.length <= op.nbytes. 128 vs
    28``: the bytes a peer sent, the bytes the rank's collective expected), or None."""
    found = _SIZE_CHECK.search(rank.error or "")
    return found.groups() if found else None


_SIZE_CHECK = re.compile(r"op\.preamble\.length <= op\.nbytes\. (\d+) vs (\d+)")


def _one_smallest(groups) -> tuple | None:
    """``groups`` largest first (ties by lowest rank), or None unless there are two or more and exactly one is the
    smallest: the odd group a divergence names."""
    ordered = tuple(sorted(groups, key=lambda g: (-len(g.ranks), g.ranks[0])))
    if len(ordered) < 2 or len(ordered[-1].ranks) == len(ordered[-2].ranks):
        return None
    return ordered


def _traces_buckets(rank: RankResult) -> bool:
    """True if ddpfaults' tracing recorded the rank's DDP gradient buckets (the model was wrapped by ctx.ddp)."""
    return any(c.maker == "ddp_bucket" for c in rank.collectives)
