"""Proving deadlocks as a world runs: each rank's standing read from its events, flight record and stack
(:mod:`ddpfaults.judge.deadlock` does the proving), for the judge loop (:func:`ddpfaults.judge.live.loop.watch`).

A proof rests on facts that cannot be undone, so the record read a moment late proves the same; what the events
only suggest (a call may raise before it makes its collective; a rank's thread may still compute) is confirmed from
the ranks' flight records, dumped on request with their stacks, before a proof counts.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

from ddpfaults.judge import deadlock
from ddpfaults.judge.deadlock import Op, Stand, Standing
from ddpfaults.judge.live import activity
from ddpfaults.judge.live.rendezvous import in_rendezvous
from ddpfaults.judge.live.watch import RankWatch
from ddpfaults.judge.verdict import innermost_frame
from ddpfaults.spec import RunSpec

if TYPE_CHECKING:
    from ddpfaults.judge.live.observer import Observer

PROOF_RETRIES = (0.02, 0.05, 0.1, 0.2, 0.4)  # seconds between checks of a deadlock the ranks' events suggest
#: seconds before the second look that confirms a point-to-point proof (the runnable check that follows guards a rank
#: still leaving its call; 0.02 s here was a fifth of the 0.1 s goal)
P2P_SECOND_LOOK = 0.005
UNTRACED_QUIET = 0.03  # seconds without an event before a rank's untraced wait (plain DDP's) is looked at


class Prover:
    """Proves a deadlock (:mod:`ddpfaults.judge.deadlock`) as soon as the ranks' record shows one.

    Each time the ranks' events change, their standings are read from the events alone (cheap: nothing is asked of
    the ranks); when those prove a deadlock, it is confirmed from the ranks' flight records, dumped on request with
    their stacks (the report needs both): a waiting rank's collective must be in its record, made by its main
    thread, of the family the proof assumed, and the last the rank made. Until confirmed, it is checked again after
    :data:`PROOF_RETRIES`, and then every last of them for as long as a rank's record has yet to show the collective
    it entered (starved of CPU, it may take seconds to issue it or to answer); once every record has answered and
    one contradicts the events, only when events change.
    """

    def __init__(self, observer: Observer, spec: RunSpec):
        self.observer, self.spec = observer, spec
        self.seen = None  # the event counts last looked at
        self.retries = list(PROOF_RETRIES)
        self.next_try = 0.0
        self.untraced: set[int] = set()  # ranks whose wait the confirmation reads from their record and stack
        self.unanswered: set[int] = set()  # ranks whose record, at the last confirmation, had yet to show their wait
        self.stacked: dict[int, tuple] = {}  # per untraced rank: its events and record when its stack was taken
        self.p2p_seen = None  # the event counts when a point-to-point proof was first found (confirmed on a later look)

    def proved(self, now: float) -> bool:
        """True (and ``observer.proof`` set) once a deadlock is proved."""
        seen = tuple(len(w.events) for w in self.observer.watches)
        if seen != self.seen:
            self.seen, self.retries, self.next_try = seen, list(PROOF_RETRIES), now
        if self.next_try is None or now < self.next_try:
            return False
        standings = self.standings(now)
        guess = deadlock.prove(standings)  # from the events alone
        point_to_point = self._p2p_proved(guess, now)
        if point_to_point is not None:
            return point_to_point
        untraced = self._untraced(standings, now)
        if untraced is None:
            return False
        if not untraced and guess is None:
            self.next_try = None  # nothing to prove until the events change
            return False
        if untraced and (not any(s.stand != Stand.FREE for s in standings) or self._threads_run(untraced)):
            return False  # nothing to start a proof from, or computing: looked at again next time
        live = self.observer.live(now)
        # only an untraced wait is read from a stack: a live rank's stack dump walks every thread's frames while gloo's
        # threads may be running DDP's Python callbacks, so it is asked of no other rank until the proof holds, and of
        # an untraced rank again only once its events or record moved (a rank sleeping in a fault is asked once)
        fresh = [i for i in untraced if self._progress(i) != self.stacked.get(i)]
        if fresh:
            self.observer.collect_stacks(fresh)
        self.observer.collect_flight_records(live)
        moved = [i for i in untraced if i not in fresh and self._progress(i) != self.stacked[i]]
        self.stacked.update({i: self._progress(i) for i in fresh})
        self.untraced = set(untraced)
        proof = None if moved else deadlock.prove(self.standings(time.monotonic(), confirm=True))
        sending = [x.rank for x in proof.stuck if x.op.group == deadlock.P2P] if proof is not None else []
        if sending and self._threads_run(sending):
            proof = None  # a send or receive the record does not confirm: its thread must not run
        if proof is None:
            gap = self.retries.pop(0) if self.retries else PROOF_RETRIES[-1] if self.unanswered else None
            self.next_try = None if gap is None else now + gap
            return False
        self.observer.collect_stacks([i for i in live if i not in self.untraced])  # the report's stacks
        self.observer.proof = proof
        return True

    def _p2p_proved(self, proof: deadlock.Proof | None, now: float) -> bool | None:
        """``proof`` (:func:`ddpfaults.judge.deadlock.prove` from the events) if it is a deadlock in blocking sends and
        receives alone (every stuck rank in a :data:`~ddpfaults.judge.deadlock.P2P` wait): True once proved
        (``observer.proof`` set), False while it waits for its confirmation (the same proof on a later look with no
        event between, and no thread of a waiting rank runnable: the flight record numbers no send or receive), None
        otherwise (no proof, or one that rests on a collective: confirmed from the flight records)."""
        if proof is None or any(x.op.group != deadlock.P2P for x in proof.stuck):
            self.p2p_seen = None
            return None
        if self.p2p_seen != self.seen:
            self.p2p_seen = self.seen
            self.next_try = now + P2P_SECOND_LOOK
            return False
        if self._threads_run([s.rank for s in proof.stuck]):
            self.next_try = now + (self.retries.pop(0) if self.retries else PROOF_RETRIES[-1])
            return False
        self.observer.collect_stacks(self.observer.live(now))  # the report's stacks
        self.observer.proof = proof
        return True

    def _threads_run(self, ranks: list[int], now: bool = False) -> bool:
        """True if any thread of any of the ``ranks`` computes (:func:`activity.computing` with ``threads``: a waiting
        rank's must not run): runnable at one of the looks, or (``now``) at one look, where an observer that cannot
        tell counts as seeing it run."""
        if now:
            return bool(activity.computing(self.observer, ranks, threads=True, looks=1, unknown=True))
        return bool(activity.computing(self.observer, ranks, threads=True, first=True))

    def _progress(self, i: int) -> tuple:
        """How far rank ``i`` is known to have got: its event count and its last flight record's collectives."""
        record = deadlock.record(self.observer.flight_record(i))
        return len(self.observer.watches[i].events), None if record is None else (record.issued, len(record.ops))

    def _untraced(self, standings: list[Standing], now: float) -> list[int] | None:
        """The ranks whose wait the events do not show but their flight record and stack may (live, quiet for
        :data:`UNTRACED_QUIET`, no thread computing: plain DDP's finalize, which waits for gradient buckets DDP issued
        itself); None if some rank may still act."""
        found = []
        for s in standings:
            if s.stand != Stand.FREE:
                continue
            w = self.observer.watches[s.rank]
            if w.ended or self.observer.dead(s.rank, now) or not w.events or w.links_dropped or w.finalizing:
                return None
            if in_rendezvous(w) is not None or now - w.last_progress < UNTRACED_QUIET:
                return None
            if self._threads_run([s.rank], now=True):
                return None  # computing, or this observer cannot tell
            found.append(s.rank)
        return found

    def standings(self, now: float, *, confirm: bool = False) -> list[Standing]:
        """Every rank's standing, from its events (``confirm``: checked against its flight record, noting in
        :attr:`unanswered` the ranks whose record has yet to show what their events say they wait in)."""
        if confirm:
            self.unanswered = set()
        return [self._standing(i, now, confirm) for i in range(len(self.observer.watches))]

    def _standing(self, i: int, now: float, confirm: bool) -> Standing:
        observer = self.observer
        w = observer.watches[i]
        free = Standing(i, Stand.FREE)
        dump = observer.flight_record(i) if confirm else None
        record = deadlock.record(dump) if confirm else None
        ops = record.ops if record is not None else ({} if confirm else w.traced_ops)  # confirmed: the record's only
        groups = deadlock.records(dump) if confirm else None
        extras = _extras(w, groups, confirm)
        if w.ended or observer.dead(i, now):
            if not w.ended or not observer.lingers(i, now, self.spec.peer_failure):
                return free  # gone: its peers will hear its connections close (a crash, not a hang)
            issued = w.end.get("pg_seq") if w.joined else -1
            if confirm and record is not None and w.joined and record.issued not in (None, issued):
                return free
            why = "finished" if w.ended == "finished" else "raised and lingers"
            return Standing(i, Stand.ENDED, issued, ops=ops, why=why, at=_at(observer, w.end), **extras)
        if w.links_dropped or not w.events:
            return free
        joining = in_rendezvous(w)
        if joining is not None:
            op = Op(0, deadlock.RENDEZVOUS)
            return Standing(i, Stand.WAITING, -1, (op,), ops, at=_at(observer, joining), **extras)
        if confirm and record is None:
            self.unanswered.add(i)
            return free  # no record to confirm its wait with
        if confirm and i in self.untraced:
            return self._waiting_for_buckets(w, record, extras) or free
        if w.finalizing is not None and "thread" not in w.finalizing:
            return self._finalizing(w, ops, record, confirm, extras) or free
        call = w.entered[max(w.entered)] if w.entered else None
        if call is None or call.get("async") or "thread" in call or call.get("pg_seq") is None:
            return free
        if call["op"] in ("send", "recv") or call.get("group") is not None:
            return self._waiting_beyond(w, call, ops, record, groups, extras) or free
        number = call["pg_seq"] + 1
        op = Op(number, deadlock.family(call["op"]), call.get("root"))
        if confirm:
            if record.issued is None or record.issued < number:
                self.unanswered.add(i)
                return free  # not issued yet, or the dump that shows it has not come
            if record.issued != number or number not in record.ops or record.threads[number] != str(w.main_ident):
                return free  # issued by another thread, or the rank went on
            op = Op(number, record.ops[number].family, call.get("root"))
        return Standing(i, Stand.WAITING, number, (op,), ops, at=_at(observer, call), **extras)

    def _waiting_beyond(self, w: RankWatch, call: dict, ops, record, groups, extras: dict) -> Standing | None:
        """A rank whose main thread waits in a blocking send or receive with a known peer (its n-th with that peer),
        or in a collective of a process group other than the default one (that group's collective #N); confirmed,
        its default group's count is its record's, and a collective its group's record's last, made by its main
        thread."""
        issued = call["pg_seq"]  # the default group's count: it made none there since
        confirm = record is not None
        if confirm and (record.issued if record.issued is not None else 0) != issued:
            return None  # it went on in the default group
        if call["op"] in ("send", "recv"):
            if not isinstance(call.get("root"), int):
                return None
            n = (w.sent if call["op"] == "send" else w.received).get(call["root"], 0)
            op = Op(n, call["op"], call["root"], deadlock.P2P)
            return Standing(w.rank, Stand.WAITING, issued, (op,), ops, at=_at(self.observer, call), **extras)
        if call.get("group_seq") is None:
            return None
        number = call["group_seq"] + 1
        members = tuple(call.get("members") or ())
        op = Op(number, deadlock.family(call["op"]), call.get("root"), call["group"], members)
        if confirm:
            theirs = (groups or {}).get(call["group"])
            if theirs is None or theirs.issued is None or theirs.issued < number:
                self.unanswered.add(w.rank)
                return None  # not issued yet, or the dump that shows it has not come
            made = theirs.ops.get(number)
            if theirs.issued != number or made is None or theirs.threads[number] != str(w.main_ident):
                return None  # issued by another thread, or the rank went on
            op = Op(number, made.family, call.get("root"), call["group"], members, made.desc)
        return Standing(w.rank, Stand.WAITING, issued, (op,), ops, at=_at(self.observer, call), **extras)

    def _finalizing(self, w: RankWatch, ops, record, confirm: bool, extras: dict) -> Standing | None:
        """A rank whose main thread waits in DDP's finalize for its open gradient buckets (ctx.ddp's)."""
        buckets = w.open_buckets()
        issued = w.finalizing.get("pg_seq")
        if not buckets or issued is None or any(e.get("pg_seq") is None for e in buckets):
            return None
        waits = tuple(Op(e["pg_seq"] + 1, "all_reduce") for e in buckets)
        if confirm:
            if record.issued is None or record.issued < issued:
                self.unanswered.add(w.rank)
                return None
            if record.issued != issued or any(record.ops.get(op.number) != op for op in waits):
                return None
        return Standing(w.rank, Stand.WAITING, issued, waits, ops, at=_at(self.observer, w.finalizing), **extras)

    def _waiting_for_buckets(self, w: RankWatch, record: deadlock.Record, extras: dict) -> Standing | None:
        """A rank whose main thread, its stack says, is in a backward pass and which no thread of computes (looked at
        before and after its stack and record were dumped): it waits in DDP's finalize for the gradient buckets its
        record shows issued during the pass, the last collective it made among them."""
        if not _in_backward(w.stack) or self._threads_run([w.rank], now=True):
            return None
        waits = record.last_backward()
        if not waits or record.threads.get(record.issued) != str(w.main_ident):
            return None
        last = w.events[-1]
        issued_at = record.walls.get(record.issued)
        at = _at(self.observer, {"t": issued_at + last["t"] - last["wall"]} if issued_at and "wall" in last else last)
        return Standing(w.rank, Stand.WAITING, record.issued, waits, record.ops, at=at, **extras)


def _extras(w: RankWatch, groups: dict | None, confirm: bool) -> dict:
    """A rank's standing in the process groups other than the default one (each group's count and collectives:
    its flight record's, confirmed; else its events' guess) and its point-to-point counts."""
    if not confirm:
        counts = {key: max(ops) for key, ops in w.group_ops.items() if ops}
        group_ops = w.group_ops
    elif groups is None:
        counts, group_ops = None, {}  # no record, or one that cannot name every group: no count known
    else:
        mine = {key: r for key, r in groups.items() if key is not None}
        counts = {key: r.issued for key, r in mine.items() if r.issued is not None}
        group_ops = {key: r.ops for key, r in mine.items()}
    return {"counts": counts, "group_ops": group_ops, "sent": dict(w.sent), "received": dict(w.received)}


def _in_backward(stack: str | None) -> bool:
    """True if a main-thread stack's innermost frame is autograd running a backward pass (in C++ below it)."""
    frame = innermost_frame(stack) or ""
    return f"torch{os.sep}autograd{os.sep}graph.py" in frame and frame.endswith(f"in {deadlock.BACKWARD_FRAME}")


def _at(observer: Observer, event: dict) -> float | None:
    """When ``event`` happened, in seconds since the world's start (None: not stamped)."""
    return observer.since_start(event["t"]) if "t" in event else None
