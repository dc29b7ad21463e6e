"""The order the ranks made their process groups in: torch names a group by a per-process counter, and every rank
must call ``new_group`` (``init_device_mesh`` calls it for every group of every dimension) for the same groups in the
same order. A rank that makes them in another order waits in ``new_group`` for peers making another group, or joins
another rank's group of the same name and trains on cross-wired. Pure functions over the ranks' ``enter`` events of
``new_group`` (ddpfaults' tracing records each, with the members of the group being made)."""

from __future__ import annotations

from ddpfaults.events import group_label
from ddpfaults.judge.attribution import Evidence
from ddpfaults.judge.ranks import format_ranks
from ddpfaults.judge.results import Collective, RankResult

#: gloo's timeout for a process group made without one (torch's default_pg_timeout), in minutes
GLOO_DEFAULT_MINUTES = 30

#: the op of an ``enter`` event a rank records as it makes a process group (ddpfaults.rank.tracing.MAKING_GROUP)
MAKING_GROUP = "new_group"


def groups_made(rank: RankResult) -> list[tuple]:
    """``(members, desc)`` of each process group the rank began to make, in order."""
    return [
        (tuple(e.get("members") or ()), e.get("note") or "")
        for e in rank.events
        if e.get("k") == "enter" and e.get("op") == MAKING_GROUP
    ]


def _name(made: tuple) -> str:
    members, desc = made
    return group_label(members, desc)


def _short(desc: str) -> str:
    """``tp`` of a DeviceMesh's ``mesh_tp``."""
    return desc.removeprefix("mesh_")


def creation_order(ranks: list[RankResult]) -> Evidence | None:
    """The ranks that made their process groups in another order than their peers, or None where every rank made
    them in one order.

    At the first place where the ranks' sequences of groups made differ (ranks that made fewer are left out: they
    may have stopped; groups each made there by exactly their members are no difference: ``new_group(...,
    use_local_synchronization=True)`` is called by the members alone), the ranks are grouped by the group they made
    there; the single smallest group made theirs in another order (``rank 2 created tp before dp``). Where the
    largest groups tie (1 against 1 at two ranks), the evidence is symmetric: each side made, as its group #N, a
    group the other made elsewhere or never, and one rank's order is as much the departure as the other's (groups
    are made once: no rank has earlier steps of its own to depart from). That is evidence naming no rank (``ranks``
    empty), saying why."""
    made = {r.rank: groups_made(r) for r in ranks}
    longest = max((len(m) for m in made.values()), default=0)
    for i in range(longest):
        at: dict[tuple, list[int]] = {}
        for rank, sequence in made.items():
            if i < len(sequence):
                at.setdefault(sequence[i], []).append(rank)
        if len(at) < 2 or all(set(makers) == set(group[0]) for group, makers in at.items()):
            continue  # one group, or each made by exactly its members (use_local_synchronization: only they call)
        ordered = sorted(at.items(), key=lambda kv: (-len(kv[1]), kv[1][0]))
        (usual, main), (other, odd) = ordered[0], ordered[-1]
        if len(ordered[-1][1]) == len(ordered[-2][1]):
            return _symmetric(ordered, made, i)
        before = ""
        if other[1] and usual[1] and other[1] != usual[1]:
            before = f": {format_ranks(odd)} created {_short(other[1])} before {_short(usual[1])}"
        shows = (
            f"{format_ranks(odd)} made {_name(other)} as its process group #{i + 1}, where {format_ranks(main)} "
            f"made {_name(usual)}{before} (torch names groups by the order each rank makes them: every rank must "
            "make the same groups in the same order)"
        )
        return Evidence(tuple(sorted(odd)), shows)
    return None


def _symmetric(ordered: list, made: dict, i: int) -> Evidence:
    """Evidence naming no rank for groups made in other orders by sides of one size (``ordered``: each group made
    as process group #``i + 1``, with the ranks that made it there; ``made``: each rank's groups in order)."""
    sides = []
    for group, members in ordered:
        alone = not any(group in sequence for rank, sequence in made.items() if rank not in members)
        sides.append(f"{format_ranks(members)} made {_name(group)}" + (", which no other rank made" if alone else ""))
    return Evidence(
        (),
        f"as process group #{i + 1} {'; '.join(sides)}: as many ranks on each side, and a group made once leaves "
        "no earlier step of a rank's own to depart from, so nothing shows which order was meant (every rank must "
        "make the same groups in the same order)",
    )


def subgroup_timeout_note(waiting: dict[int, Collective | None]) -> str:
    """A clause for a hang's reason when hung ranks wait in a group other than the default one, or in ``new_group``
    (``waiting``: each hung rank's innermost traced wait): such a group does not take ``init_process_group``'s
    timeout (measured under torchrun: ``new_group`` and ``init_device_mesh`` give gloo's 30-minute default unless
    passed one), so that is how long the job would hang there; "" otherwise."""
    ranks = sorted(r for r, call in waiting.items() if call is not None and (call.group or call.op == MAKING_GROUP))
    if not ranks:
        return ""
    return (
        f"; {format_ranks(ranks)} wait{'s' if len(ranks) == 1 else ''} in a process group made by new_group or "
        f"init_device_mesh, which under torchrun does not take init_process_group's timeout: gloo's "
        f"{GLOO_DEFAULT_MINUTES}-minute default unless the group is made with timeout="
    )
