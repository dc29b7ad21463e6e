"""Deadlocks proved from the record, not timed: pure functions over what each rank stands in (no processes, no torch).

Gloo matches the ranks' collectives by number: the N-th collective a rank issues on a process group meets the N-th
of every other rank, on a channel of its own kind (gloo's *slot*: all_reduce, all_gather, barrier, broadcast,
scatter, gather, reduce, all_to_all each have one). A collective whose result needs a peer's part (every peer's, for
all_reduce, all_gather, barrier, all_to_all and at the root of gather and reduce; the root's, for the other ranks of
broadcast and scatter) can therefore never complete when that peer will never issue a collective of the same kind
with the same number: either it will never issue that many collectives (it finished, or is itself stuck before
them), or its collective of that number is of another kind (it reads another slot).

:func:`prove` takes every waiting rank as stuck and lets go, until nothing changes, of each whose waits all have
every needed peer able to get there: a peer that ended (it keeps its process and connections open: a finished rank
waiting for the verdict, a failed one lingering) or that is still taken as stuck, having made fewer collectives of
that group than the wait's number, never will; nor will one that made another kind with that number. The ranks left
wait on one another, or on ranks that ended, and none can leave its wait before another of them does: each is stuck
for good. The world is proved deadlocked when every rank that is still running is stuck. Every step is a consequence
of facts that cannot be undone (a rank issued collective N of kind K; a rank's process lives on without issuing
more), so a proof made from a record read a moment late is still true. A rank that may still act — running outside
any collective, starting, gone (its peers will hear that its connections closed) or whose wait is unknown — leaves
the world unproved: the stall rule judges it.

Collective numbers are each process group's, as torch's flight recorder counts them (gloo's numbering, the same on
every member); 0 is the default group's own rendezvous (``init_process_group``), which needs every rank. Every group a
rank waits in, and its blocking sends and receives (matched pair by pair, by each pair's count), make one wait-for
graph: a rank in a tp all_reduce waits for a peer that may be stuck in a dp barrier or a receive.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

from ddpfaults.events import group_label
from ddpfaults.judge.flight import group_identities
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


#: the ``group`` of an :class:`Op` that is a blocking send or receive: matched pair by pair, by each pair's count
P2P = "p2p"


@dataclass(frozen=True)
class Op:
    """One wait a rank's main thread is in, or one collective it issued: a collective's ``number`` in its process
    group, its gloo slot ``family`` (None: unknown) and, for a rooted collective, its ``root`` (global) rank (None:
    unknown); ``group``, the group's identity (:func:`ddpfaults.events.group_key`; None: the default group) with its
    ``members`` (global ranks) and ``desc`` (its name in a report). A blocking send or receive is an Op of group
    :data:`P2P`: ``family`` ``"send"`` or ``"recv"``, ``root`` the peer, ``number`` its count toward that peer."""

    number: int
    family: str | None
    root: int | None = None
    group: str | None = None
    members: tuple[int, ...] | None = None
    desc: str | None = field(default=None, compare=False)

    def describe(self, before: int = 0) -> str:
        """``collective #8 (all_reduce)``, ``collective #2 (barrier) of process group mesh_dp of ranks 1, 3``, ``its
        recv #3 from rank 1``, or ``the process group's rendezvous`` for collective 0; the default group's numbered
        from the job's first collective (``before``: how many it made in earlier jobs of a warm world)."""
        if self.family == RENDEZVOUS:
            return "the process group's rendezvous (init_process_group)"
        if self.group == P2P:
            return f"its {self.family} #{self.number} {'to' if self.family == 'send' else 'from'} rank {self.root}"
        kind = f" ({self.family}" + (f" from rank {self.root}" if self.root is not None else "") + ")"
        number = self.number - before if self.group is None else self.number
        of = f" of {group_label(self.members or (), self.desc)}" if self.group is not None else ""
        return f"collective #{number}" + (kind if self.family else "") + of


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
    it never joined the group; None: unknown); ``waits``, for a waiting rank, what its main thread waits for (it is
    stuck if any of them can never complete); ``ops``, the default group's collectives it is known to have issued,
    by number (their kinds); ``counts`` and ``group_ops``, the same of each other process group it is in, by the
    group's identity (a group it is not known to have used counts 0; ``counts`` None: not known, so no proof rests
    on the rank's count in any other group); ``sent`` and ``received``, the blocking or not sends and receives it has
    begun, by peer; ``why``, how it ended (``finished``, ``raised KeyError``...); ``at``, when it took this stand
    (seconds since the world's start: its finishing or blocking event)."""

    rank: int
    stand: Stand
    issued: int | None = None
    waits: tuple[Op, ...] = ()
    ops: Mapping[int, Op] = field(default_factory=dict)
    why: str = ""
    at: float | None = None
    counts: Mapping[str, int] | None = field(default_factory=dict)
    group_ops: Mapping[str, Mapping[int, Op]] = field(default_factory=dict)
    sent: Mapping[int, int] = field(default_factory=dict)
    received: Mapping[int, int] = field(default_factory=dict)

    def made(self, op: Op, rank: int) -> int | None:
        """How far this rank has got on ``op``'s channel as ``rank`` needs it: the number of its last collective in
        ``op``'s group, or of its sends to (receives from) ``rank`` for ``rank``'s receive (send); None: unknown."""
        if op.group == P2P:
            return (self.sent if op.family == "recv" else self.received).get(rank, 0)
        made = self.issued if op.group is None else None if self.counts is None else self.counts.get(op.group, 0)
        waits = [w.number for w in self.waits if w.group == op.group]  # what it waits in, it made
        return max([made, *waits]) if made is not None else None

    def made_at(self, op: Op) -> Op | None:
        """The collective this rank made with ``op``'s number in ``op``'s group, if known."""
        if op.group == P2P:
            return None
        return (self.ops if op.group is None else self.group_ops.get(op.group, {})).get(op.number)


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
        before = before if self.op.group is None else 0
        if self.ended:
            if self.op.group == P2P:
                noun = "send(s) to" if self.op.family == "recv" else "receive(s) from"
                return f"it {self.ended} after {self.last} {noun} rank {self.rank}"
            if self.last is not None and self.last < 0:
                return f"it {self.ended} without joining the process group"
            made = self.last - before if self.last is not None else 0
            of = f" of {group_label(self.op.members or (), self.op.desc)}" if self.op.group is not None else ""
            return f"it {self.ended} " + (f"after its collective #{made}{of}" if made > 0 else f"before making any{of}")
        theirs = (self.theirs.number, self.theirs.group) if self.theirs is not None else None
        if self.op.group != P2P and theirs == (self.op.number, self.op.group):  # the same slot (pairs have none)
            return f"its collective #{self.theirs.number - before} is {self.theirs.family}"
        if self.theirs is None:
            return "it never makes it"
        return f"it is stuck in {self.theirs.describe(before if self.theirs.group is None else 0)}"


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
            key = (s.op.describe(before), s.op.family, s.peer, s.because(before))
            groups.setdefault(key if s.op.group != P2P else (*key, s.rank), []).append(s.rank)
        for (op, kind, peer, because, *_), ranks in groups.items():
            never = "receives" if kind == "send" else "sends" if kind == "recv" and op.startswith("its ") else "makes"
            parts.append(
                f"{format_ranks(ranks)} wait{'s' if len(ranks) == 1 else ''} in {op}, which rank {peer} never "
                f"{never} ({because})"
            )
        return "; ".join(parts)


def needed_peers(op: Op, rank: int, world_size: int) -> list[int]:
    """The ranks whose part ``rank``'s wait ``op`` cannot complete without ([]: none known): a collective's (its
    group's members, or the world's) or a send's or receive's peer."""
    if op.group == P2P:
        return [op.root] if op.root is not None and op.root != rank and 0 <= op.root < world_size else []
    if op.group is not None and op.members is None:
        return []
    members = op.members if op.group is not None else range(world_size)
    others = [r for r in members if r != rank and 0 <= r < world_size]
    if op.family in NEED_EVERY_RANK:
        return others
    if op.family in NEED_THE_ROOT:
        return [op.root] if op.root is not None and op.root in others else []
    if op.family in ROOT_NEEDS_EVERY_RANK:
        return others if op.root == rank else []
    return []


def _never_made(op: Op, rank: int, by_rank: Mapping[int, Standing], blocked: set[int]) -> Stuck | None:
    """Why ``rank`` is stuck in ``op``: a peer it needs never makes it (preferring a peer that ended before it, then
    one that made another kind of collective there, then one that waits, in ``blocked``, before it), or None."""
    peers = needed_peers(op, rank, len(by_rank))
    short = []
    for p in peers:
        other = by_rank[p]
        made = other.made(op, rank)
        if made is not None and made < op.number and (other.stand == Stand.ENDED or p in blocked):
            short.append((other.stand != Stand.ENDED, made, p))
    if short and not min(short)[0]:
        _, made, peer = min(short)
        return Stuck(rank, op, peer, last=made, ended=by_rank[peer].why or "ended")
    if op.family is not None and op.group != P2P:
        for p in peers:
            theirs = by_rank[p].made_at(op)
            if theirs is not None and theirs.family is not None and theirs.family != op.family:
                return Stuck(rank, op, p, theirs=theirs)
    if short:
        _, made, peer = min(short)
        return Stuck(rank, op, peer, last=made)
    return None


def prove(standings: list[Standing]) -> Proof | None:
    """The proof that no rank still running can ever leave what it waits in, or None.

    ``standings`` holds one :class:`Standing` per rank of the world, in rank order. None unless every rank is
    ENDED (with a known ``issued``) or WAITING, at least one is WAITING, and each WAITING rank is proved stuck: the
    waiting ranks are taken as stuck, and a rank is let go while none of its waits has a needed peer that never
    makes it (ended, or taken as stuck, before it; or made another kind there), until nothing changes. What is left
    is stuck for good: none of them can leave its wait before another of them does. Waits in different process
    groups and in sends and receives make one graph (a rank in a tp all_reduce waiting for a peer stuck in a dp
    barrier waiting for it)."""
    waiting = [s for s in standings if s.stand == Stand.WAITING]
    if not waiting or any(s.stand == Stand.FREE or s.issued is None for s in standings):
        return None
    by_rank = {s.rank: s for s in standings}
    blocked = {s.rank for s in waiting}
    changed = True
    while changed:
        changed = False
        for s in waiting:
            if s.rank in blocked and all(_never_made(op, s.rank, by_rank, blocked) is None for op in s.waits):
                blocked.discard(s.rank)
                changed = True
    if len(blocked) < len(waiting):
        return None
    found: dict[int, Stuck] = {}
    for s in waiting:
        found[s.rank] = next(x for op in s.waits if (x := _never_made(op, s.rank, by_rank, blocked)) is not None)
    stuck = []
    for s in waiting:  # a peer stuck in turn: name the wait it is stuck in
        x = found[s.rank]
        if x.theirs is None and not x.ended:
            x = Stuck(x.rank, x.op, x.peer, last=x.last, theirs=found[x.peer].op)
        stuck.append(x)
    times = [s.at for s in standings if s.at is not None]
    return Proof(
        ended=tuple((s.rank, s.why) for s in standings if s.stand == Stand.ENDED),
        stuck=tuple(stuck),
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
    found = records(dump, every_group=False)
    return None if found is None else found[None]


def records(dump: dict | None, *, every_group: bool = True) -> dict[str | None, Record] | None:
    """Each process group's collectives in a flight-recorder dump, by the group's identity (None: the default group;
    :func:`ddpfaults.judge.flight.group_identities`, the same on every rank), or None without a dump. A group the
    dump counts collectives of but cannot name (its entries gone from the recorder's ring) makes the whole answer
    None (``every_group``; else it is left out): a count missing from it could not be told from a group that made
    none."""
    if not dump:
        return None
    identities = group_identities(dump.get("pg_config"))
    keys: dict[int, str | None] = {DEFAULT_GROUP: None}
    for entry in dump.get("entries") or []:
        name = (entry.get("process_group") or ("0",))[0]
        if entry.get("pg_id") is not None and str(name) != "0" and str(name) in identities:
            keys[int(entry["pg_id"])] = identities[str(name)][0]
    status = dump.get("pg_status") or {}
    unnamed = [
        pg_id for pg_id, st in status.items() if int(pg_id) not in keys and st.get("last_enqueued_collective", 0) > 0
    ]
    if every_group and unnamed:
        return None
    found = {}
    for pg_id, key in keys.items():
        issued = (status.get(str(pg_id)) or {}).get("last_enqueued_collective")
        ops, threads, backward, walls = {}, {}, set(), {}
        for entry in dump.get("entries") or []:
            if entry.get("pg_id") != pg_id or entry.get("is_p2p") or entry.get("collective_seq_id") is None:
                continue
            number = int(entry["collective_seq_id"])
            members, desc = (None, None) if key is None else _member_of(identities, key)
            name = family(str(entry.get("profiling_name", "")))
            ops[number] = Op(number, name, group=key, members=members, desc=desc)
            threads[number] = str(entry.get("thread_id", ""))
            if entry.get("time_created_ns"):
                walls[number] = entry["time_created_ns"] / 1e9
            if any(frame.get("name") == BACKWARD_FRAME for frame in entry.get("frames") or []):
                backward.add(number)
        found[key] = Record(int(issued) if issued is not None else None, ops, threads, frozenset(backward), walls)
    return found


def _member_of(identities: dict, key: str) -> tuple:
    """``(members, desc)`` of the group ``key`` among a dump's :func:`~ddpfaults.judge.flight.group_identities`."""
    return next(((tuple(members), desc) for k, members, desc in identities.values() if k == key), ((), None))
