"""Deadlocks proved from the record, not timed: pure functions over what each rank stands in (no processes, no torch).

Gloo matches the ranks' collectives by number: the N-th collective a rank issues on a process group meets the N-th
of every other rank, on a channel of its own kind (gloo's *slot*: all_reduce, all_gather, barrier, broadcast,
scatter, gather, reduce, all_to_all each have one). A collective whose result needs a peer's part (every peer's, for
all_reduce, all_gather, barrier, all_to_all and at the root of gather and reduce; the root's, for the other ranks of
broadcast and scatter) can therefore never complete when that peer will never issue a collective of the same kind
with the same number: either it will never issue that many collectives (it finished, or is itself stuck before
them), or its collective of that number is of another kind (it reads another slot).

:func:`prove` starts from the ranks that will never issue another collective (those that ended and keep their
process and connections open: a finished rank waiting for the verdict, a failed one lingering) and the known kinds
of the ranks' collectives, and finds, until nothing changes, the ranks whose main thread waits in a collective that
can never complete: each is stuck for good, so it too will issue no further collective. The world is proved
deadlocked when every rank that is still running is stuck. Every step is a consequence of facts that cannot be
undone (a rank issued collective N of kind K; a rank's process lives on without issuing more), so a proof made from
a record read a moment late is still true. A rank that may still act — running outside any collective, starting,
gone (its peers will hear that its connections closed) or whose wait is unknown — leaves the world unproved: the
stall rule judges it.

Collective numbers are the default group's, as torch's flight recorder counts them; 0 is the process group's own
rendezvous (``init_process_group``), which needs every rank.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

from ddpfaults.judge.results import format_ranks

#: a torch.distributed function, or a flight-recorder entry's name (after ``gloo:``), -> the gloo slot family it uses
FAMILIES = {
    "all_reduce": "all_reduce",
    "all_reduce_coalesced": "all_reduce",
    "all_gather": "all_gather",
    "all_gather_into_tensor": "all_gather",
    "_allgather_base": "all_gather",
    "barrier": "barrier",
    "broadcast": "broadcast",
    "reduce": "reduce",
    "gather": "gather",
    "scatter": "scatter",
    "all_to_all": "all_to_all",
    "all_to_all_single": "all_to_all",
    "alltoall_base": "all_to_all",
}
RENDEZVOUS = "init_process_group"  # the family of collective 0: the process group's rendezvous
#: families whose result on every rank needs every rank's part
NEED_EVERY_RANK = frozenset({"all_reduce", "all_gather", "barrier", "all_to_all", RENDEZVOUS})
#: families whose ranks other than the root need the root's part (the root itself only sends)
NEED_THE_ROOT = frozenset({"broadcast", "scatter"})
#: families whose root needs every rank's part (the others only send)
ROOT_NEEDS_EVERY_RANK = frozenset({"gather", "reduce"})


def family(name: str | None) -> str | None:
    """The gloo slot family of a torch.distributed function or flight-recorder entry name (None: unknown)."""
    if name is None:
        return None
    return FAMILIES.get(name.split(":", 1)[-1])


@dataclass(frozen=True)
class Op:
    """One collective a rank issued on the default group: its ``number`` there, its gloo slot ``family`` (None:
    unknown) and, for a rooted collective, its ``root`` rank (None: unknown)."""

    number: int
    family: str | None
    root: int | None = None

    def describe(self, before: int = 0) -> str:
        """``collective #8 (all_reduce)``, or ``the process group's rendezvous`` for collective 0; numbered from the
        job's first collective (``before``: how many the group made in earlier jobs of a warm world)."""
        if self.family == RENDEZVOUS:
            return "the process group's rendezvous (init_process_group)"
        kind = f" ({self.family}" + (f" from rank {self.root}" if self.root is not None else "") + ")"
        return f"collective #{self.number - before}" + (kind if self.family else "")


class Stand(str, enum.Enum):
    """Where a rank stands, as far as the proof is concerned."""

    ENDED = "ended"  # its function ended; its process and connections stay open; it will issue no collective
    WAITING = "waiting"  # its main thread waits in the collectives ``waits`` (all it does until they complete)
    FREE = "free"  # anything else: it may still act (running, starting, gone, or waiting on something unknown)

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Standing:
    """What one rank stands in: ``stand``; ``issued``, how many collectives of the default group it has issued (-1:
    it never joined the group; None: unknown); ``waits``, for a waiting rank, the collectives its main thread waits
    for (it is stuck if any of them can never complete); ``ops``, the collectives it is known to have issued, by
    number (their kinds); ``why``, how it ended (``finished``, ``raised KeyError``...); ``at``, when it took this
    stand (seconds since the world's start: its finishing or blocking event)."""

    rank: int
    stand: Stand
    issued: int | None = None
    waits: tuple[Op, ...] = ()
    ops: Mapping[int, Op] = field(default_factory=dict)
    why: str = ""
    at: float | None = None


@dataclass(frozen=True)
class Stuck:
    """A rank proved stuck: it waits in ``op``, which can never complete because rank ``peer`` never makes it: the
    peer ended (``ended``: how) after its collective ``last`` (-1: without joining the group), or is stuck itself
    in ``theirs`` (``last``: the last it made), or made ``theirs``, of another kind, with ``op``'s number."""

    rank: int
    op: Op
    peer: int
    last: int | None = None
    theirs: Op | None = None
    ended: str = ""

    def because(self, before: int = 0) -> str:
        """Why the peer never makes it: ``it finished after its collective #7``, ``its collective #8 is barrier``,
        ``it is stuck in collective #6 (all_reduce)`` (numbered from the job's first collective: ``before``)."""
        if self.ended:
            if self.last is not None and self.last < 0:
                return f"it {self.ended} without joining the process group"
            made = self.last - before if self.last is not None else 0
            return f"it {self.ended} " + (f"after its collective #{made}" if made > 0 else "before making any")
        if self.theirs is not None and self.theirs.number == self.op.number:
            return f"its collective #{self.theirs.number - before} is {self.theirs.family}"
        return f"it is stuck in {self.theirs.describe(before)}" if self.theirs else "it never makes it"


@dataclass(frozen=True)
class Proof:
    """A deadlock proved: the ranks that ended (and how), the ranks stuck (and why), and ``formed``, when the last of
    them took its stand (seconds since the world's start; None: unknown)."""

    ended: tuple[tuple[int, str], ...]
    stuck: tuple[Stuck, ...]
    formed: float | None

    def describe(self, before: int = 0) -> str:
        """One sentence: who ended, who waits where and why that can never complete; collectives numbered from the
        job's first (``before``: how many the group made in earlier jobs of a warm world), as divergences are."""
        parts = []
        if self.ended:
            by_why: dict[str, list[int]] = {}
            for rank, why in self.ended:
                by_why.setdefault(why, []).append(rank)
            parts.append("; ".join(f"{format_ranks(r)} {why}" for why, r in by_why.items()))
        groups: dict[tuple, list[int]] = {}
        for s in self.stuck:
            groups.setdefault((s.op, s.peer, s.because(before)), []).append(s.rank)
        for (op, peer, because), ranks in groups.items():
            parts.append(
                f"{format_ranks(ranks)} wait{'s' if len(ranks) == 1 else ''} in {op.describe(before)}, which "
                f"rank {peer} never makes ({because})"
            )
        return "; ".join(parts)


def needed_peers(op: Op, rank: int, world_size: int) -> list[int]:
    """The ranks whose part ``rank``'s collective ``op`` cannot complete without ([]: none known)."""
    others = [r for r in range(world_size) if r != rank]
    if op.family in NEED_EVERY_RANK:
        return others
    if op.family in NEED_THE_ROOT:
        return [op.root] if op.root is not None and op.root != rank and 0 <= op.root < world_size else []
    if op.family in ROOT_NEEDS_EVERY_RANK:
        return others if op.root == rank else []
    return []


def _never_made(op: Op, rank: int, peers: list[int], ctx: _Facts) -> Stuck | None:
    """Why ``rank`` is stuck in ``op``: one of ``peers`` never makes it (preferring a peer that ended, then one that
    made another kind of collective there, then one that is stuck), or None."""
    if not peers:
        return None
    ended = [(ctx.final[p], p) for p in ctx.ended_by_count[:2] if p != rank]
    if len(peers) < len(ctx.standings) - 1:  # a rooted collective: only its root counts
        ended = [(ctx.final[p], p) for p in peers if p in ctx.final and p not in ctx.stuck]
    if ended and min(ended)[0] < op.number:
        count, peer = min(ended)
        return Stuck(rank, op, peer, last=count, ended=ctx.standings[peer].why or "ended")
    if op.family is not None:
        kinds = ctx.kinds.get(op.number, {})
        for other, ranks in kinds.items():
            if other != op.family:
                peer = next((p for p in sorted(ranks) if p != rank and p in peers), None)
                if peer is not None:
                    return Stuck(rank, op, peer, theirs=Op(op.number, other))
    stuck = [(ctx.final[p], p) for p in peers if p in ctx.stuck]
    if stuck and min(stuck)[0] < op.number:
        count, peer = min(stuck)
        return Stuck(rank, op, peer, last=count, theirs=ctx.stuck[peer].op)
    return None


@dataclass
class _Facts:
    """What the proof knows so far: every rank's standing, the last collective each ended or stuck rank will make
    (``final``; ``ended_by_count``: the ended ranks, fewest collectives first), the ranks proved stuck, and the kinds
    of the collectives made at each number a rank waits at (``kinds``: number -> family -> ranks)."""

    standings: Mapping[int, Standing]
    final: dict[int, int]
    ended_by_count: list[int]
    stuck: dict[int, Stuck]
    kinds: dict[int, dict[str, set[int]]]


def prove(standings: list[Standing]) -> Proof | None:
    """The proof that no rank still running can ever leave the collective it waits in, or None.

    ``standings`` holds one :class:`Standing` per rank of the world, in rank order. None unless every rank is
    ENDED (with a known ``issued``) or WAITING, at least one is WAITING, and each WAITING rank is proved stuck (see
    the module's docstring)."""
    world_size = len(standings)
    waiting = [s for s in standings if s.stand == Stand.WAITING]
    if not waiting or any(s.stand == Stand.FREE or s.issued is None for s in standings):
        return None
    final = {s.rank: s.issued for s in standings if s.stand == Stand.ENDED}  # the last collective each will make
    numbers = {op.number for s in waiting for op in s.waits}
    kinds: dict[int, dict[str, set[int]]] = {}
    for s in standings:
        for number in numbers:
            theirs = s.ops.get(number)
            if theirs is not None and theirs.family is not None:
                kinds.setdefault(number, {}).setdefault(theirs.family, set()).add(s.rank)
    if not final and all(len(families) == 1 for families in kinds.values()):
        return None  # nothing any rank waits for is known never to come: nothing to start from
    ctx = _Facts({s.rank: s for s in standings}, final, sorted(final, key=lambda r: (final[r], r)), {}, kinds)
    changed = True
    while changed:
        changed = False
        for s in waiting:
            if s.rank in ctx.stuck:
                continue
            for op in s.waits:
                found = _never_made(op, s.rank, needed_peers(op, s.rank, world_size), ctx)
                if found is not None:
                    ctx.stuck[s.rank] = found
                    final[s.rank] = s.issued  # stuck for good: it issues nothing more
                    changed = True
                    break
    if any(s.rank not in ctx.stuck for s in waiting):
        return None
    times = [s.at for s in standings if s.at is not None]
    return Proof(
        ended=tuple((s.rank, s.why) for s in standings if s.stand == Stand.ENDED),
        stuck=tuple(ctx.stuck[s.rank] for s in waiting),
        formed=max(times) if len(times) == len(standings) else None,
    )


#: the key of the default group in a flight-recorder dump (its status, its entries' ``pg_id``): torch numbers a
#: process's groups as it makes them, and the default group is the first (a rank reports no collective counts for a
#: default group made again, so no proof rests on one)
DEFAULT_GROUP = 0


#: the frame through which autograd runs a backward pass: a collective issued below it is DDP's (a gradient bucket)
BACKWARD_FRAME = "_engine_run_backward"


@dataclass(frozen=True)
class Record:
    """What a rank's flight-recorder dump says of its default group: ``issued``, the number of its last collective
    (None: the dump has no status for the group), and ``ops``, each collective it holds, by number, with its family,
    the thread that issued it (``threads``), whether it was issued during a backward pass (``backward``: DDP's
    gradient buckets) and when (``walls``)."""

    issued: int | None
    ops: Mapping[int, Op]
    threads: Mapping[int, str]
    backward: frozenset = frozenset()
    walls: Mapping[int, float] = field(default_factory=dict)  # when each was issued (Unix seconds)

    def last_backward(self) -> tuple[Op, ...]:
        """The collectives issued during a backward pass, up to the last one issued, without a collective issued
        outside one between them: the gradient buckets DDP's finalize waits for (with earlier, completed ones)."""
        found = []
        number = self.issued
        while number is not None and number in self.backward and number in self.ops:
            found.append(self.ops[number])
            number -= 1
        return tuple(reversed(found))


def record(dump: dict | None) -> Record | None:
    """The default group's collectives in a flight-recorder dump (torch's pickle, unpickled), or None without one."""
    if not dump:
        return None
    status = (dump.get("pg_status") or {}).get(str(DEFAULT_GROUP)) or {}
    issued = status.get("last_enqueued_collective")
    ops, threads, backward, walls = {}, {}, set(), {}
    for entry in dump.get("entries") or []:
        if entry.get("pg_id") != DEFAULT_GROUP or entry.get("is_p2p") or entry.get("collective_seq_id") is None:
            continue
        number = int(entry["collective_seq_id"])
        ops[number] = Op(number, family(str(entry.get("profiling_name", ""))))
        threads[number] = str(entry.get("thread_id", ""))
        if entry.get("time_created_ns"):
            walls[number] = entry["time_created_ns"] / 1e9
        if any(frame.get("name") == BACKWARD_FRAME for frame in entry.get("frames") or []):
            backward.add(number)
    return Record(int(issued) if issued is not None else None, ops, threads, frozenset(backward), walls)
