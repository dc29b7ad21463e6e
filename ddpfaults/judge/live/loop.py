"""The one judge loop: watch a world through an :class:`Observer` until it ends, stalls or times out; judge it.

Two observers exist: the local launcher's (rank files and processes on this machine,
:mod:`ddpfaults.engine.launcher`) and torchrun's (keys of the torch.distributed store,
:mod:`ddpfaults.torchrun.store`). The rules live here once:

- a world has *ended* when no rank is live (every rank finished, failed or died);
- it is *hung* (:attr:`StopReason.STALL`) when no rank made progress for ``stall`` seconds and every live
  rank waits on its peers: inside a traced collective or store wait, or (untraced) with its main-thread
  stack in torch.distributed / DDP / autograd while using no CPU; a rank still starting up, computing, or
  idle outside collectives is never hung; in ``peer_failure="exit"`` mode gloo is first given
  :data:`PEER_EXIT_GRACE` to tell the peers of a failure;
- starved is not blocked: a rank whose main thread is runnable, computed in the window (:class:`CpuWindow`), or did not
  answer its stack request (it did not get the CPU to) keeps the world alive, whatever its events say;
- start-up (some rank has not joined the process group yet) is judged by the same evidence: a rendezvous every
  unjoined rank has entered is in progress, and a rank importing or computing is starting; at the start-up limit
  (:attr:`StopReason.STARTUP`, ``spec.startup_limit``, at most the timeout) the ranks still starting are kept in
  ``observer.still_starting`` (the world then timed out; none: the ranks that never joined were idle: hung);
- it is *hung* at once (:attr:`StopReason.PROVEN`) when the record proves a deadlock: every live rank waits in a
  collective, send or receive a peer can never make (:mod:`ddpfaults.judge.live.prover`,
  :mod:`ddpfaults.judge.deadlock`);
- in ``peer_failure="exit"`` mode it is *crashed* (:attr:`StopReason.ABANDONED`) when a rank failed and every live
  rank waits to join the process group, the failed rank never will, and those ranks are seen waiting
  (:class:`QuietRendezvous`): a rank still running its own code there may yet fail on its own;
- ``timeout`` is the hard cap; an observer may also ask to stop (torchrun's agent tearing the world down);
- when the first rank is seen failed or dead, every live rank's stack is taken: the survivors of a crash
  are shown where they stood when it happened.
"""

from __future__ import annotations

import dataclasses
import pickle
import time

from ddpfaults import events
from ddpfaults.judge import flight
from ddpfaults.judge.attribution import attribute, culprits
from ddpfaults.judge.causes import find_cause
from ddpfaults.judge.desync import cross_step
from ddpfaults.judge.divergence import first_divergence_found
from ddpfaults.judge.groups import creation_order, subgroup_timeout_note
from ddpfaults.judge.live import activity, branches
from ddpfaults.judge.live.observer import Observer
from ddpfaults.judge.live.prover import Prover
from ddpfaults.judge.live.rendezvous import QuietRendezvous, abandoned, in_rendezvous, under_way
from ddpfaults.judge.live.watch import frame_text
from ddpfaults.judge.p2p import p2p_finding, split_finding
from ddpfaults.judge.results import Busy, Outcome, RankResult, RankState, WorldResult
from ddpfaults.judge.verdict import (
    decide,
    is_importing,
    is_waiting_stack,
    mark_collateral,
    unfired_faults,
)
from ddpfaults.spec import RunSpec, StopReason

POLL_MIN, POLL_MAX = 0.005, 0.05  # seconds between looks at the ranks: often while busy, less when quiet
PEER_EXIT_GRACE = 2.0  # gloo needs ~1-1.5 s to tell peers that a rank exited ("Connection closed by peer")
#: seconds a live rank gets to answer a request for its stack or flight record: a guard, not a measure. The wait
#: ends as every rank asked has answered, exited, died or reported its end; only a rank that cannot answer (its request
#: thread starved of the GIL by native code) costs it. A 1 s wait ran out under load and the verdict was then told
#: from less evidence (the tracing instead of torch's record: another collective named, the same world).
ANSWER_GUARD = 10.0
_PROVE = True  # prove deadlocks from the record; off only in bench/bench_proof.py, to time the stall rule beside it


def watch(observer: Observer, spec: RunSpec) -> StopReason:
    """Watch until the world ended, stalled, timed out, or the observer asks to stop; return why."""
    last_assessed = 0.0
    failure_seen = False
    prover = Prover(observer, spec)
    window = CpuWindow(observer)
    rendezvous = QuietRendezvous(observer)
    while True:
        quiet = time.monotonic() - max(w.last_progress for w in observer.watches)
        observer.poll(min(POLL_MAX, max(POLL_MIN, quiet / 20)))
        now = time.monotonic()
        live = observer.live(now)
        if not live:
            # a rank may have written its last events (a fault that fired, then SIGKILLed itself) and exited
            # between this poll's read and live(): read once more, so what it wrote before exiting is judged
            observer.poll(0)
            if not failure_seen:
                _forget_stacks_before_failure(observer, live)
            return StopReason.ENDED
        just_failed = not failure_seen and any(
            w.ended == "failed" or observer.dead(w.rank, now) for w in observer.watches
        )
        if just_failed:
            failure_seen = True  # the survivors' stacks at the moment the first failure is seen
            _forget_stacks_before_failure(observer, live)
            observer.collect_stacks(live)
        if spec.peer_failure == "exit" and abandoned(observer, live, now):
            if rendezvous.idle(live, now):
                observer.collect_stacks(live)
                return StopReason.ABANDONED
        else:
            rendezvous.reset()
        starting = under_way(observer, now)
        if starting and now - observer.t0 >= spec.startup_limit:
            stop = StopReason.STARTUP
        elif now - observer.t0 >= spec.timeout:
            stop = StopReason.TIMEOUT
        else:
            stop = observer.stop_requested(now)
        if stop is not None:
            if stop == StopReason.TIMEOUT:
                observer.computing_at_deadline = tuple(window.computing(live))  # starved of CPU, not waiting
            observer.collect_stacks(live)
            if starting:
                observer.still_starting = tuple(_still_starting(observer, live, now, window))
            return stop
        if _PROVE and prover.proved(now):
            return StopReason.PROVEN
        last = max(w.last_progress for w in observer.watches)
        window.update(live, last, now, spec.stall)
        if now - last >= spec.stall and now - last_assessed >= min(spec.stall / 4, 0.5):
            last_assessed = now
            if not _recent_failure(observer, spec, now) and _all_blocked(observer, live, now, window, starting):
                return StopReason.STALL


class CpuWindow:
    """Each live rank's evidence of computing (:func:`activity.mark`), sampled once per quiet spell half a stall window
    into it, for :func:`activity.computing` to measure the rest of the spell against (the stall rule, the hard
    timeout, start-up)."""

    def __init__(self, observer: Observer):
        self.observer = observer
        self.spell = None  # the last progress the spell began with
        self.stall = 0.0  # the stall window
        self.taken: float | None = None  # when the sample was taken (None: not yet in this spell)
        self.marks: dict[int, activity.Mark] = {}

    def update(self, live: list[int], last_progress: float, now: float, stall: float) -> None:
        """Start a new spell at new progress; take the sample once the spell is half a stall window old."""
        self.stall = stall
        if last_progress != self.spell:
            self.spell, self.taken, self.marks = last_progress, None, {}
        if self.taken is None and now - last_progress >= stall / 2:
            self.taken = now
            self.marks = activity.mark(self.observer, live, now)

    def covers(self, now: float) -> bool:
        """True once the sample is half a stall window old (or this observer cannot tell a main thread's CPU)."""
        known = any(m.cpu is not None for m in self.marks.values())
        return self.taken is not None and (not known or now - self.taken >= self.stall / 2)

    def computing(self, indices: list[int]) -> list[int]:
        """The ranks among ``indices`` whose main thread computed since the sample (:data:`activity.WAITING`; before
        the sample is taken, runnable at one of the looks)."""
        return activity.computing(self.observer, indices, self.marks)


def _forget_stacks_before_failure(observer: Observer, live: list[int]) -> None:
    """A rank's stack in the report is the one taken when the first failure was seen: a rank no longer live then has
    none, and one the prover took earlier (reading an untraced wait) must not be shown as if it were."""
    for w in observer.watches:
        if w.rank not in live:
            w.stack = None


def _recent_failure(observer: Observer, spec: RunSpec, now: float) -> bool:
    """In exit mode gloo needs a moment to tell the peers of a failed rank; don't call that a hang yet."""
    seen = observer.failures_seen(now) if spec.peer_failure == "exit" else []
    return bool(seen) and now - max(seen) < PEER_EXIT_GRACE


def _all_blocked(observer: Observer, live: list[int], now: float, window: CpuWindow, starting: bool) -> bool:
    """True if every live rank waits on its peers (traced wait, or a waiting stack and no CPU), none of them computing
    however starved (runnable, computing in the ``window``, or it did not answer its stack request), and
    (``starting``: some rank has not joined the process group) not every unjoined rank in the rendezvous."""
    unsure, polling = [], []
    for i in live:
        w = observer.watches[i]
        if not w.events:
            return False  # still starting (importing torch, connecting): busy, not yet able to dump its stack
        if (call := w.waiting_in()) is not None:
            if call.op in ("init_process_group", "new_group") or call.op.startswith("store."):
                polling.append(i)  # a FileStore wait polls its file: its main thread runs a little, often
            continue
        if activity.computing(
            observer, [i], activity.at_progress(observer, [i]), threads=True, allowance=activity.BUSY
        ):
            return False  # computing: slow, not hung
        unsure.append(i)
    if starting and all(in_rendezvous(observer.watches[i]) is not None for i in live if not observer.watches[i].joined):
        return False  # every rank that has not joined is in the rendezvous: it is under way, however slow
    if not window.covers(now):
        return False  # the evidence of the main threads' CPU is not in yet
    computing = [i for i in live if i not in polling]
    if window.computing(computing):
        return False  # computing with a small share of a core (more ranks than cores): slow, not hung
    if unsure:
        observer.collect_stacks(unsure)
        if not all(is_waiting_stack(observer.watches[i].stack) for i in unsure):
            return False
    waiting = [i for i in live if i not in unsure]
    observer.collect_stacks(waiting)
    last = max(w.last_progress for w in observer.watches)
    observer.poll(0)  # what the ranks wrote meanwhile: a rank that left its collective made progress
    if max(w.last_progress for w in observer.watches) != last:
        return False
    return all(observer.watches[i].stack is not None for i in waiting if observer.watches[i].events)


def _still_starting(observer: Observer, live: list[int], now: float, window: CpuWindow) -> list[int]:
    """The live ranks, not joined and not in the rendezvous, still starting when start-up's limit came (their stacks
    just taken): no event yet, no stack (it did not get the CPU to answer), importing, or computing (busy since its
    last event, computing in the ``window``, or runnable). The others that never joined were idle."""
    found = []
    for i in live:
        w = observer.watches[i]
        if w.joined or in_rendezvous(w) is not None:
            continue
        if (
            not w.events
            or w.stack is None
            or is_importing(w.stack)
            or activity.computing(
                observer, [i], activity.at_progress(observer, [i]), threads=True, allowance=activity.BUSY
            )
            or window.computing([i])
        ):
            found.append(i)
    return found


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
        busy=Busy.of(i in observer.still_starting, i in observer.computing_at_deadline),
        **observer.describe(i),
    )
    reported = observer.reported(i)
    if reported is not None and reported["error"] is None:
        res.state = RankState.FINISHED
        try:
            res.value = pickle.loads(reported["value"])
        except Exception as exc:  # noqa: BLE001 - a value this process cannot rebuild is shown, not fatal
            res.value = f"<unpicklable here: {type(exc).__name__}: {exc}>"
        res.wrapped = reported.get("wrapped", [])
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


def _recorded_collectives(observer: Observer, i: int) -> list:
    """Rank ``i``'s collectives from its flight-recorder dump, made since its job started ([] without one)."""
    dump = observer.flight_record(i)
    start = next((e for e in observer.watches[i].events if e["k"] == "start"), None)
    if dump is None or start is None:
        return []
    timeline = observer.watches[i].events
    steps = [(e["wall"], e["step"], e.get("pg_seq")) for e in timeline if e["k"] == "step"]
    batches = [(e["index"], e.get("pg_seq")) for e in timeline if e["k"] == "batch"]
    fresh = bool(start.get("fresh_record"))  # the record began empty with the job: numbered by torch's record ids
    return flight.collectives(dump, since_wall=start["wall"], steps=steps, batches=batches, fresh=fresh)


def judge(observer: Observer, spec: RunSpec, reason: StopReason, *, plan=(), **about) -> WorldResult:
    """The world's result: every rank's result, collateral errors marked, divergence, root cause, outcome, and
    which faults of ``plan`` (the world's fault values) fired and which never did.

    ``about`` holds the :class:`WorldResult` fields the judge cannot know (function, replay, ...).
    """
    observer.collect_flight_records(observer.live(time.monotonic()))
    # the dumps were taken after the stop: read what the ranks wrote before them (a world still training at its
    # timeout made steps meanwhile), so that every recorded collective is placed in the step it was made in
    observer.poll(0)
    now = time.monotonic()
    recorded = [_recorded_collectives(observer, i) for i in range(len(observer.watches))]
    ranks = [rank_result(observer, i, reason, now, spec.peer_failure, recorded[i]) for i in range(len(recorded))]
    mark_collateral(ranks)
    fired = [f for w in observer.watches for f in w.fired]
    # each rank's fullest record (torch's, else ddpfaults' tracing): what each rank did, for the attribution
    done = [dataclasses.replace(r, collectives=recorded[r.rank] or r.collectives) for r in ranks]
    finished = all(r.state == RankState.FINISHED for r in ranks)  # no failure: nothing to single out
    inside = {} if finished else branches.find(ranks)  # where each rank's control flow went: rank-only code
    # a rank that made its process groups in another order waits in new_group (or trains on cross-wired)
    order = None if finished else creation_order(ranks)
    divergence = attribute(first_divergence_found(ranks, recorded), done, fired, inside, order)
    # point-to-point messages are matched pair by pair (judge/p2p.py), never in the collective sequences
    deviation = (
        None if finished else (order or p2p_finding(ranks) or split_finding(ranks) or culprits(done, fired, inside))
    )
    deadline = spec.startup_limit if reason == StopReason.STARTUP else spec.timeout
    cause = find_cause(ranks, plan)
    decision = decide(ranks, divergence, reason, deadline=deadline, stall=spec.stall, deviation=deviation, cause=cause)
    for rank in ranks:
        rank.timed_out = decision.outcome == Outcome.TIMED_OUT
    elapsed = now - observer.t0
    timeline = [events.event("verdict", t=round(elapsed, 6), reason=str(reason))]
    described = reason.describe(spec)
    if reason == StopReason.STALL:
        last = max(w.last_progress for w in observer.watches) - observer.t0
        timeline.insert(0, events.event("stall", t=round(last, 6), window=spec.stall))
    elif reason == StopReason.PROVEN and observer.proof is not None:
        proof = observer.proof
        starts = [next((e for e in w.events if e["k"] == "start"), {}) for w in observer.watches]
        before = min(e.get("pg_seq") or 0 for e in starts)  # collectives the group made in earlier jobs
        described = f"{described}: {proof.describe(before)}"  # numbered from the job's first collective
        if proof.formed is not None:  # when the last rank took its stand: the deadlock formed
            stuck = [s.rank for s in proof.stuck]
            timeline.insert(0, events.event("deadlock", t=round(proof.formed, 6), ranks=stuck))
    if decision.outcome == Outcome.HUNG:
        waits = {i: observer.watches[i].waiting_in() for i in range(len(observer.watches))}
        described += subgroup_timeout_note({i: c for i, c in waits.items() if ranks[i].state == RankState.BLOCKED})
    return WorldResult(
        outcome=decision.outcome,
        ranks=ranks,
        root_cause=decision.root_cause,
        root_rank=decision.root_rank,
        reason=described,
        elapsed=elapsed,
        spec=spec,
        events=timeline,
        divergence=decision.divergence,
        cause=decision.cause,
        desync=cross_step(done),
        faults=[repr(f) for f in plan],
        fired=fired,
        unfired=unfired_faults(plan, ranks, fired),
        **about,
    )
