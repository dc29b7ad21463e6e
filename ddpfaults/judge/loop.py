"""The one judge loop: watch a world through an :class:`Observer` until it ends, stalls or times out; judge it.

Two observers exist: the local launcher's (rank files and processes on this machine,
:mod:`ddpfaults.engine.launcher`) and torchrun's (keys of the torch.distributed store,
:mod:`ddpfaults.torchrun.store`). The rules live here once:

- a world has *ended* when no rank is live (every rank finished, failed or died);
- while its ranks are still joining the process group (start-up), it is never judged hung by the stall rule,
  only by the start-up limit (:attr:`StopReason.STARTUP`, ``spec.startup_limit``) or the timeout;
- it is *hung* (:attr:`StopReason.STALL`) when no rank made progress for ``stall`` seconds and every live
  rank waits on its peers: inside a traced collective or store wait, or (untraced) with its main-thread
  stack in torch.distributed / DDP / autograd while using no CPU; a rank still starting up, computing, or
  idle outside collectives is never hung; in ``peer_failure="exit"`` mode gloo is first given
  :data:`PEER_EXIT_GRACE` to tell the peers of a failure;
- ``timeout`` is the hard cap; an observer may also ask to stop (torchrun's agent tearing the world down);
- when the first rank is seen failed or dead, every live rank's stack is taken: the survivors of a crash
  are shown where they stood when it happened.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import time

from ddpfaults.judge import deadlock, flight
from ddpfaults.judge.deadlock import Op, Stand, Standing
from ddpfaults.judge.results import Divergence, DivergenceGroup, RankResult, RankState, WorldResult
from ddpfaults.judge.verdict import (
    first_divergence,
    gloo_aborted,
    innermost_frame,
    is_collateral,
    is_waiting_stack,
    mark_collateral,
    root_cause,
    unfired_faults,
    world_outcome,
)
from ddpfaults.judge.watch import RankWatch, frame_text, is_busy
from ddpfaults.spec import RunSpec, StopReason

POLL_MIN, POLL_MAX = 0.005, 0.05  # seconds between looks at the ranks: often while busy, less when quiet
RUNNABLE_LOOKS, RUNNABLE_GAP = 3, 0.005  # looks at the ranks' /proc state (and seconds between them)
PEER_EXIT_GRACE = 2.0  # gloo needs ~1-1.5 s to tell peers that a rank exited ("Connection closed by peer")
PROOF_RETRIES = (0.02, 0.05, 0.1, 0.2, 0.4)  # seconds between checks of a deadlock the ranks' events suggest
UNTRACED_QUIET = 0.03  # seconds without an event before a rank's untraced wait (plain DDP's) is looked at
_PROVE = True  # prove deadlocks from the record; off only in bench/bench_proof.py, to time the stall rule beside it


class Observer:
    """How the judge sees a world's ranks; ``watches[i]`` is rank i's view, kept current by :meth:`poll`.

    ``t0`` is the world's start on this process's monotonic clock; ``failed_where`` is what a rank that
    raised is doing while the verdict is pending (in ``peer_failure="exit"`` mode).
    """

    watches: list[RankWatch]
    t0: float
    failed_where = "raised; exiting"
    finished_ranks_linger = True  # a rank whose function returned keeps its process and connections until the verdict
    proof: deadlock.Proof | None = None  # what :func:`watch` proved, when it stopped with StopReason.PROVEN

    def poll(self, wait: float) -> None:
        """Wait up to ``wait`` seconds for news, then bring every rank's watch up to date."""
        raise NotImplementedError

    def dead(self, i: int, now: float) -> bool:
        """True if rank ``i`` is gone without reporting its end (exited, killed, heartbeat stopped)."""
        raise NotImplementedError

    def failures_seen(self, now: float) -> list[float]:
        """When this observer saw ranks fail or die (monotonic times)."""
        raise NotImplementedError

    def cpu(self, i: int) -> float | None:
        """Rank ``i``'s CPU seconds so far (None if unknown)."""
        raise NotImplementedError

    def runnable(self, i: int) -> bool:
        """True if rank ``i`` is computing right now, however little CPU it gets (False: unknown)."""
        return False

    def threads_runnable(self, i: int) -> bool | None:
        """True if any thread of rank ``i``'s process is computing right now (None: unknown)."""
        return None

    def collect_stacks(self, indices: list[int]) -> None:
        """Have the given live ranks dump their main thread's stack into ``watches[i].stack``."""
        raise NotImplementedError

    def stop_requested(self, now: float) -> StopReason | None:
        """A reason to stop that only this observer knows (None: keep watching)."""
        return None

    def reported(self, i: int) -> dict | None:
        """The result rank ``i`` published with its end (value or error, traceback, site), or None."""
        raise NotImplementedError

    def death(self, i: int, reason: StopReason, now: float) -> tuple[str, str, str | None, float | None] | None:
        """``(error, output, stack, failed_at)`` if rank ``i`` died without reporting, else None."""
        raise NotImplementedError

    def collect_flight_records(self, indices: list[int]) -> None:
        """Have the given live ranks dump their flight recorder (ended ranks dumped theirs at the end)."""

    def flight_record(self, i: int) -> dict | None:
        """Rank ``i``'s flight-recorder dump, unpickled (None: not available; the tracing is the record)."""
        return None

    def exited(self, i: int) -> bool:
        """True if rank ``i``'s process is known to have ended."""
        return False

    def unstarted(self, i: int) -> bool:
        """True if rank ``i``'s process was never started (start-up ran out of time before its turn)."""
        return False

    def describe(self, i: int) -> dict:
        """Facts about rank ``i`` for its result: ``pid``, ``exitcode``, ``output``, ``events`` (t since start)."""
        raise NotImplementedError

    def live(self, now: float) -> list[int]:
        """Ranks still running their function (not ended, not dead)."""
        return [w.rank for w in self.watches if not w.ended and not self.dead(w.rank, now)]

    def lingers(self, i: int, now: float, peer_failure: str) -> bool:
        """True if rank ``i`` ended and keeps its process and its connections to its peers open until the verdict
        (a finished rank, unless finished ranks exit; a failed one in ``peer_failure="linger"`` mode), so that a peer
        waiting on it waits for ever instead of reading that its connections closed."""
        w = self.watches[i]
        if w.links_dropped or self.dead(i, now) or self.exited(i):
            return False
        if w.ended == "finished":
            return self.finished_ranks_linger
        return w.ended == "failed" and peer_failure == "linger"

    def since_start(self, t: float) -> float:
        """An event's time ``t`` (as its rank stamped it) in seconds since the world's start."""
        return t - self.t0


def watch(observer: Observer, spec: RunSpec) -> StopReason:
    """Watch until the world ended, stalled, timed out, or the observer asks to stop; return why."""
    last_assessed = 0.0
    failure_seen = False
    prover = _Prover(observer, spec)
    while True:
        quiet = time.monotonic() - max(w.last_progress for w in observer.watches)
        observer.poll(min(POLL_MAX, max(POLL_MIN, quiet / 20)))
        now = time.monotonic()
        live = observer.live(now)
        if not live:
            # a rank may have written its last events (a fault that fired, then SIGKILLed itself) and exited
            # between this poll's read and live(): read once more, so what it wrote before exiting is judged
            observer.poll(0)
            return StopReason.ENDED
        just_failed = not failure_seen and any(
            w.ended == "failed" or observer.dead(w.rank, now) for w in observer.watches
        )
        if just_failed:
            failure_seen = True  # the survivors' stacks at the moment the first failure is seen
            observer.collect_stacks(live)
        if spec.peer_failure == "exit" and _abandoned(observer, live, now):
            if not just_failed:
                observer.collect_stacks(live)
            return StopReason.ABANDONED
        starting = _starting(observer, now)
        if starting and now - observer.t0 >= spec.startup_limit:
            stop = StopReason.STARTUP
        elif now - observer.t0 >= spec.timeout:
            stop = StopReason.TIMEOUT
        else:
            stop = observer.stop_requested(now)
        if stop is None and starting:
            continue  # ranks still joining are slow, not hung: the stall rule waits for the rendezvous
        if stop is not None:
            observer.collect_stacks(live)
            return stop
        if _PROVE and prover.proved(now):
            return StopReason.PROVEN
        quiet = now - max(w.last_progress for w in observer.watches)
        if quiet >= spec.stall and now - last_assessed >= min(spec.stall / 4, 0.5):
            last_assessed = now
            if not _recent_failure(observer, spec, now) and _all_blocked(observer, live, now):
                return StopReason.STALL


def _in_rendezvous(w: RankWatch) -> dict | None:
    """The "enter" event of the ``init_process_group`` rank ``w`` is in, if it has not joined the group yet."""
    if w.joined:
        return None
    return next((e for e in w.entered.values() if e.get("op") == "init_process_group"), None)


def _abandoned(observer: Observer, live: list[int], now: float) -> bool:
    """True when a rank failed with its own error (not a consequence of another's) or died, and every rank still
    running waits in ``init_process_group``: in ``peer_failure="exit"`` mode the failed rank's process ends, so the
    rendezvous can never complete with it (those ranks wait for ever, or fail connecting to it) and the world is a
    crash, those ranks its collateral, as under torchrun."""
    failed = [
        w
        for w in observer.watches
        if (w.ended == "failed" and not is_collateral((w.end or {}).get("error"))) or observer.dead(w.rank, now)
    ]
    return bool(failed) and bool(live) and all(_in_rendezvous(observer.watches[i]) is not None for i in live)


class _Prover:
    """Proves a deadlock (:mod:`ddpfaults.judge.deadlock`) as soon as the ranks' record shows one.

    Each time the ranks' events change, their standings are read from the events alone (cheap: nothing is asked of
    the ranks); when those prove a deadlock, it is confirmed from the ranks' flight records, dumped on request with
    their stacks (the report needs both): a waiting rank's collective must be in its record, made by its main
    thread, of the family the proof assumed, and the last the rank made. Until confirmed, it is checked again after
    :data:`PROOF_RETRIES` (a rank may not have issued the collective it entered yet), then only when events change.
    """

    def __init__(self, observer: Observer, spec: RunSpec):
        self.observer, self.spec = observer, spec
        self.seen = None  # the event counts last looked at
        self.retries = list(PROOF_RETRIES)
        self.next_try = 0.0
        self.untraced: set[int] = set()  # ranks whose wait the confirmation reads from their record and stack

    def proved(self, now: float) -> bool:
        """True (and ``observer.proof`` set) once a deadlock is proved."""
        seen = tuple(len(w.events) for w in self.observer.watches)
        if seen != self.seen:
            self.seen, self.retries, self.next_try = seen, list(PROOF_RETRIES), now
        if self.next_try is None or now < self.next_try:
            return False
        standings = self.standings(now)
        untraced = self._untraced(standings, now)
        if untraced is None:
            return False
        if not untraced and deadlock.prove(standings) is None:
            self.next_try = None  # nothing to prove until the events change
            return False
        if untraced and (
            not any(s.stand != Stand.FREE for s in standings) or _any_threads_runnable(self.observer, untraced)
        ):
            return False  # nothing to start a proof from, or computing: looked at again next time
        live = self.observer.live(now)
        self.observer.collect_stacks(live)  # asks for their flight records too
        self.observer.collect_flight_records(live)
        self.untraced = set(untraced)
        proof = deadlock.prove(self.standings(time.monotonic(), confirm=True))
        if proof is None:
            self.next_try = now + self.retries.pop(0) if self.retries else None
            return False
        self.observer.proof = proof
        return True

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
            if _in_rendezvous(w) is not None or now - w.last_progress < UNTRACED_QUIET:
                return None
            if self.observer.threads_runnable(s.rank) is not False:
                return None  # computing, or this observer cannot tell
            found.append(s.rank)
        return found

    def standings(self, now: float, *, confirm: bool = False) -> list[Standing]:
        """Every rank's standing, from its events (``confirm``: checked against its flight record)."""
        return [self._standing(i, now, confirm) for i in range(len(self.observer.watches))]

    def _standing(self, i: int, now: float, confirm: bool) -> Standing:
        observer = self.observer
        w = observer.watches[i]
        free = Standing(i, Stand.FREE)
        record = deadlock.record(observer.flight_record(i)) if confirm else None
        ops = record.ops if record is not None else ({} if confirm else w.traced_ops)  # confirmed: the record's only
        if w.ended or observer.dead(i, now):
            if not w.ended or not observer.lingers(i, now, self.spec.peer_failure):
                return free  # gone: its peers will hear its connections close (a crash, not a hang)
            issued = w.end.get("pg_seq") if w.joined else -1
            if confirm and record is not None and w.joined and record.issued not in (None, issued):
                return free
            why = "finished" if w.ended == "finished" else "raised and lingers"
            return Standing(i, Stand.ENDED, issued, ops=ops, why=why, at=_at(observer, w.end))
        if w.links_dropped or not w.events:
            return free
        joining = _in_rendezvous(w)
        if joining is not None:
            op = Op(0, deadlock.RENDEZVOUS)
            return Standing(i, Stand.WAITING, -1, (op,), ops, at=_at(observer, joining))
        if confirm and record is None:
            return free  # no record to confirm its wait with
        if confirm and i in self.untraced:
            return self._waiting_for_buckets(w, record) or free
        if w.finalizing is not None and "thread" not in w.finalizing:
            return self._finalizing(w, ops, record, confirm) or free
        call = w.entered[max(w.entered)] if w.entered else None
        if call is None or call.get("async") or "thread" in call or call.get("pg_seq") is None:
            return free
        number = call["pg_seq"] + 1
        op = Op(number, deadlock.family(call["op"]), call.get("root"))
        if confirm:
            if record.issued != number or number not in record.ops or record.threads[number] != str(w.main_ident):
                return free  # not issued yet, issued by another thread, or the rank went on
            op = Op(number, record.ops[number].family, call.get("root"))
        return Standing(i, Stand.WAITING, number, (op,), ops, at=_at(observer, call))

    def _finalizing(self, w: RankWatch, ops, record, confirm: bool) -> Standing | None:
        """A rank whose main thread waits in DDP's finalize for its open gradient buckets (ctx.ddp's)."""
        buckets = w.open_buckets()
        issued = w.finalizing.get("pg_seq")
        if not buckets or issued is None or any(e.get("pg_seq") is None for e in buckets):
            return None
        waits = tuple(Op(e["pg_seq"] + 1, "all_reduce") for e in buckets)
        if confirm:
            if record.issued != issued or any(record.ops.get(op.number) != op for op in waits):
                return None
        return Standing(w.rank, Stand.WAITING, issued, waits, ops, at=_at(self.observer, w.finalizing))

    def _waiting_for_buckets(self, w: RankWatch, record: deadlock.Record) -> Standing | None:
        """A rank whose main thread, its stack says, is in a backward pass and which no thread of computes (looked at
        before and after its stack and record were dumped): it waits in DDP's finalize for the gradient buckets its
        record shows issued during the pass, the last collective it made among them."""
        if not _in_backward(w.stack) or self.observer.threads_runnable(w.rank) is not False:
            return None
        waits = record.last_backward()
        if not waits or record.threads.get(record.issued) != str(w.main_ident):
            return None
        last = w.events[-1]
        issued_at = record.walls.get(record.issued)
        at = _at(self.observer, {"t": issued_at + last["t"] - last["wall"]} if issued_at and "wall" in last else last)
        return Standing(w.rank, Stand.WAITING, record.issued, waits, record.ops, at=at)


def _in_backward(stack: str | None) -> bool:
    """True if a main-thread stack's innermost frame is autograd running a backward pass (in C++ below it)."""
    frame = innermost_frame(stack) or ""
    return f"torch{os.sep}autograd{os.sep}graph.py" in frame and frame.endswith(f"in {deadlock.BACKWARD_FRAME}")


def _any_threads_runnable(observer: Observer, indices: list[int]) -> bool:
    """True if a thread of any of the ranks is runnable in one of :data:`RUNNABLE_LOOKS` looks over them all."""
    for look in range(RUNNABLE_LOOKS):
        if any(observer.threads_runnable(i) for i in indices):
            return True
        if look + 1 < RUNNABLE_LOOKS:
            time.sleep(RUNNABLE_GAP)
    return False


def _at(observer: Observer, event: dict) -> float | None:
    """When ``event`` happened, in seconds since the world's start (None: not stamped)."""
    return observer.since_start(event["t"]) if "t" in event else None


def _starting(observer: Observer, now: float) -> bool:
    """True while the rendezvous can still complete: some rank has not joined the process group yet, and none
    has ended (finished, failed or died) without joining (its peers would then wait for it for ever)."""
    unjoined = [w for w in observer.watches if not w.joined]
    return bool(unjoined) and not any(w.ended or observer.dead(w.rank, now) for w in unjoined)


def _recent_failure(observer: Observer, spec: RunSpec, now: float) -> bool:
    """In exit mode gloo needs a moment to tell the peers of a failed rank; don't call that a hang yet."""
    seen = observer.failures_seen(now) if spec.peer_failure == "exit" else []
    return bool(seen) and now - max(seen) < PEER_EXIT_GRACE


def _all_blocked(observer: Observer, live: list[int], now: float) -> bool:
    """True if every live rank waits on its peers (traced wait, or a waiting stack and no CPU)."""
    unsure = []
    for i in live:
        w = observer.watches[i]
        if not w.events:
            return False  # still starting (importing torch, connecting): busy, not yet able to dump its stack
        if w.waiting_in() is not None:
            continue
        if is_busy(observer.cpu(i), w.cpu_at_progress, w.last_progress, now):
            return False  # computing: slow, not hung
        unsure.append(i)
    if unsure:
        if _any_runnable(observer, unsure):
            return False  # computing with a small share of a core (more ranks than cores): slow, not hung
        observer.collect_stacks(unsure)
        if not all(is_waiting_stack(observer.watches[i].stack) for i in unsure):
            return False
    observer.collect_stacks([i for i in live if i not in unsure])
    return True


def _any_runnable(observer: Observer, indices: list[int]) -> bool:
    """True if any of the ranks is runnable in one of :data:`RUNNABLE_LOOKS` looks over them all."""
    for look in range(RUNNABLE_LOOKS):
        if any(observer.runnable(i) for i in indices):
            return True
        if look + 1 < RUNNABLE_LOOKS:
            time.sleep(RUNNABLE_GAP)
    return False


def rank_result(
    observer: Observer, i: int, reason: StopReason, now: float, peer_failure: str, recorded: list
) -> RankResult:
    """What rank ``i`` did, as the judge found it (``recorded``: its flight-recorder collectives, if any)."""
    w = observer.watches[i]
    res = RankResult(
        rank=i,
        state=RankState.RUNNING,
        last_step=w.step,
        collectives=[dataclasses.replace(c, seq=n) for n, c in enumerate(w.collectives, 1)],  # #N is the N-th
        fired=w.fired,
        **observer.describe(i),
    )
    reported = observer.reported(i)
    if reported is not None and reported["error"] is None:
        res.state = RankState.FINISHED
        try:
            res.value = pickle.loads(reported["value"])
        except Exception as exc:  # noqa: BLE001 - a value this process cannot rebuild is shown, not fatal
            res.value = f"<unpicklable here: {type(exc).__name__}: {exc}>"
        if not observer.exited(i):
            res.where = "finished; waiting for the verdict"
    elif reported is not None:
        res.state, res.stack = RankState.RAISED, w.stack  # its stack when a failure was first seen, if taken
        res.error, res.traceback, res.site = reported["error"], reported["traceback"], reported["site"]
        failed = [e["t"] for e in res.events if e["k"] == "failed"]
        res.failed_at = failed[0] if failed else None
        if not observer.exited(i):
            res.where = "raised; lingering" if peer_failure == "linger" else observer.failed_where
    elif (death := observer.death(i, reason, now)) is not None:
        res.state = RankState.DIED
        res.error, res.output, res.stack, res.failed_at = death
        if res.stack:
            res.where = f"died in {frame_text(res.stack)}"
    elif not w.events:
        res.where = (
            "never started (start-up ran out of time first)" if observer.unstarted(i) else "starting (no event yet)"
        )
    else:
        waiting = w.waiting_in()
        open_calls = [c for c in recorded if not c.done]
        if open_calls and (waiting is None or is_waiting_stack(w.stack)):
            waiting = open_calls[-1]  # the recorder sees collectives the tracing does not (DDP's own)
        if waiting is not None:
            res.state, res.where = RankState.BLOCKED, f"in {waiting.describe()}"
        elif is_waiting_stack(w.stack):
            res.state, res.where = RankState.BLOCKED, f"untraced wait: {frame_text(w.stack)}"
        else:
            res.where = frame_text(w.stack)
        res.stack = w.stack
    return res


def _divergence(ranks: list[RankResult], recorded: list[list]):
    """The first divergent collective: from torch's flight recorder, over the ranks that left a dump (a rank
    killed by a signal leaves none); failing that, from ddpfaults' tracing, which every rank has but which
    misses what DDP and libraries call themselves; failing both, the records set beside where gloo aborted the
    ranks that left none. The ranks compared keep the record the divergence was found in (the two number
    collectives differently)."""
    having = [i for i, record in enumerate(recorded) if record]
    unrecorded = [rank for rank in ranks if rank.rank not in having]
    divergence = None
    if len(having) >= 2:
        divergence = first_divergence([dataclasses.replace(ranks[i], collectives=recorded[i]) for i in having])
    if unrecorded and divergence is not None and len({len(g.ranks) for g in divergence.groups}) == 1:
        # the survivors' records split evenly (rank 0 vs rank 2, rank 1 aborted by gloo without a dump): which rank
        # happened to leave a dump must not decide the blame (seen: 2 worlds in 120)
        divergence = _placed_by_stack(divergence, unrecorded)
    if unrecorded:
        traced = first_divergence(ranks)
        if divergence is None and traced is None and having:
            # seen: rank 0's record alone in 97 worlds of 100 (gloo aborted both receivers first), blaming rank 1
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
    unless every unrecorded rank was aborted so and one group is the single smallest."""
    lasts = [recorded[i][-1] for i in having]
    if len({(c.signature(), c.site) for c in lasts}) != 1 or len({len(recorded[i]) for i in having}) != 1:
        return None
    sites: dict = {lasts[0].site: list(having)}
    for rank in unrecorded:
        site = flight.stack_site(rank.stack)
        if not gloo_aborted(rank) or site is None:
            return None
        sites.setdefault(site, []).append(rank.rank)
    groups = _one_smallest(
        DivergenceGroup(tuple(sorted(members)), lasts[0])
        if site == lasts[0].site
        else DivergenceGroup(tuple(sorted(members)), None, f"gloo aborted them in a collective at {site}")
        for site, members in sites.items()
    )
    return groups and Divergence(len(recorded[having[0]]), groups, groups[-1].ranks)


def _one_smallest(groups) -> tuple | None:
    """``groups`` largest first (ties by lowest rank), or None unless there are two or more and exactly one is the
    smallest: the odd group a divergence names."""
    ordered = tuple(sorted(groups, key=lambda g: (-len(g.ranks), g.ranks[0])))
    if len(ordered) < 2 or len(ordered[-1].ranks) == len(ordered[-2].ranks):
        return None
    return ordered


def _traces_buckets(rank: RankResult) -> bool:
    """True if ddpfaults' tracing recorded the rank's DDP gradient buckets (the model was wrapped by ctx.ddp)."""
    return any(c.note.startswith("DDP gradient bucket") for c in rank.collectives)


def _recorded_collectives(observer: Observer, i: int) -> list:
    """Rank ``i``'s collectives from its flight-recorder dump, made since its job started ([] without one)."""
    dump = observer.flight_record(i)
    start = next((e for e in observer.watches[i].events if e["k"] == "start"), None)
    if dump is None or start is None:
        return []
    steps = [(e["wall"], e["step"], e.get("pg_seq")) for e in observer.watches[i].events if e["k"] == "step"]
    return flight.collectives(dump, since_wall=start["wall"], steps=steps)  # the recorder's clock is the wall clock


def judge(observer: Observer, spec: RunSpec, reason: StopReason, *, plan=(), **about) -> WorldResult:
    """The world's result: every rank's result, collateral errors marked, divergence, root cause, outcome, and
    which faults of ``plan`` (the world's fault values) fired and which never did.

    ``about`` holds the :class:`WorldResult` fields the judge cannot know (function, replay, ...).
    """
    observer.collect_flight_records(observer.live(time.monotonic()))
    now = time.monotonic()
    recorded = [_recorded_collectives(observer, i) for i in range(len(observer.watches))]
    ranks = [rank_result(observer, i, reason, now, spec.peer_failure, recorded[i]) for i in range(len(recorded))]
    mark_collateral(ranks)
    divergence = _divergence(ranks, recorded)
    root_rank, cause = root_cause(ranks, divergence, reason)
    elapsed = now - observer.t0
    events = [{"k": "verdict", "t": round(elapsed, 6), "reason": str(reason)}]
    described = reason.describe(spec)
    if reason == StopReason.STALL:
        last = max(w.last_progress for w in observer.watches) - observer.t0
        events.insert(0, {"k": "stall", "t": round(last, 6), "window": spec.stall})
    elif reason == StopReason.PROVEN and observer.proof is not None:
        proof = observer.proof
        described = f"{described}: {proof.describe()}"
        if proof.formed is not None:  # when the last rank took its stand: the deadlock formed
            events.insert(0, {"k": "deadlock", "t": round(proof.formed, 6), "ranks": [s.rank for s in proof.stuck]})
    fired = [f for w in observer.watches for f in w.fired]
    return WorldResult(
        outcome=world_outcome(ranks, reason),
        ranks=ranks,
        root_cause=cause,
        root_rank=root_rank,
        reason=described,
        elapsed=elapsed,
        world_size=spec.world_size,
        events=events,
        seed=spec.seed,
        backend=spec.backend,
        peer_failure=spec.peer_failure,
        stall=spec.stall,
        timeout=spec.timeout,
        startup=spec.custom_startup,
        divergence=divergence,
        faults=[repr(f) for f in plan],
        fired=fired,
        unfired=unfired_faults(plan, ranks, fired),
        **about,
    )
