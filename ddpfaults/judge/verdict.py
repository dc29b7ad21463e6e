"""Verdict logic: pure functions over rank results (no processes, no torch)."""

from __future__ import annotations

import bisect
import math
import re
from dataclasses import dataclass

from ddpfaults.judge import seams
from ddpfaults.judge.attribution import Evidence
from ddpfaults.judge.ranks import format_ranks
from ddpfaults.judge.results import (
    POINT_TO_POINT,
    Busy,
    Cause,
    Collective,
    Divergence,
    DivergenceGroup,
    Outcome,
    RankResult,
    RankState,
    UnfiredFault,
)
from ddpfaults.spec import StopReason

#: error texts that are consequences of another rank's failure (or of a hang), never a root cause
COLLATERAL_PATTERNS = (
    r"Connection closed by peer",
    r"Connection reset by peer",
    r"Broken pipe",
    r"Timed out waiting \d+ms",
    r"Application timeout caused pair closure",
    r"Socket Timeout",
    r"[Tt]imed out .*(store|wait)",
    r"NCCL communicator was aborted",
)
_COLLATERAL = re.compile("|".join(COLLATERAL_PATTERNS))

#: innermost-frame locations where a rank outside any traced collective is waiting on its peers
WAITING_FRAMES = (
    re.compile(r"torch/distributed/"),
    re.compile(r"torch/nn/parallel/distributed\.py"),
    re.compile(r"torch/autograd/"),
)


def is_collateral(error: str | None) -> bool:
    """True if ``error`` is the kind of message a rank gets when a *peer* failed or the world hung."""
    return bool(error) and _COLLATERAL.search(error) is not None


def innermost_frame(stack: str | None) -> str | None:
    """The innermost ``File "...", line N in f`` line of a faulthandler thread dump."""
    for line in (stack or "").splitlines():
        if line.strip().startswith("File "):
            return line.strip()
    return None


def is_importing(stack: str | None) -> bool:
    """True if a rank's main-thread stack shows an import in progress (computing, however long it takes)."""
    return "importlib._bootstrap" in (stack or "")


def is_waiting_stack(stack: str | None) -> bool:
    """True if a rank's main-thread stack shows it inside torch.distributed, DDP or autograd's backward."""
    frame = innermost_frame(stack)
    if frame is None or is_importing(stack):
        return False  # an import in progress (even of torch.distributed code) is computing, not waiting
    return any(p.search(frame) for p in WAITING_FRAMES)


def _absent(rank: RankResult) -> str:
    """Why a rank has no collective at some position."""
    if rank.state == RankState.FINISHED:
        return "finished"
    if rank.state in (RankState.RAISED, RankState.DIED):
        return rank.error or "died"
    return f"was at {rank.where or 'an untraced point'}"


def first_divergence(ranks: list[RankResult]) -> Divergence | None:
    """Compare the ranks' collective sequences; return the first position where they differ.

    Each process group has its own sequence, compared only among the group's members (the default group's among
    every rank; a subgroup's, known by its :func:`~ddpfaults.events.group_key`, among its ``members``): two tensor
    parallel pairs of a 2-D mesh each run their own. Ranks that raised or died are compared only up to where they
    stopped: a crash ends a sequence early without being a divergence (its error is the root cause instead).
    Point-to-point ops (send/recv) are left out: they pair two ranks, as many on each side as the pattern needs. A
    record that torch's ring buffer cut short begins after collective #1 (its first ``seq``): every sequence is
    compared from the latest first collective any rank's record holds, so records cut at different points still
    line up. The divergence is numbered by its collectives' ``seq``; of several groups' divergences the earliest
    is returned (at one number, the one made at the earlier step: :func:`_earliness`). The odd ranks are the
    single smallest group, if there is one (a vote);
    :func:`ddpfaults.judge.attribution.attribute` weighs what each rank did.
    """
    if len(ranks) < 2:
        return None
    start = max((r.collectives[0].seq for r in ranks if r.collectives), default=1)
    calls = {r.rank: [c for c in r.collectives if c.op not in POINT_TO_POINT and c.seq >= start] for r in ranks}
    members: dict = {None: None}  # group key -> its member ranks (None: every rank)
    for call in (c for cs in calls.values() for c in cs):
        if call.group is not None and members.get(call.group) is None:
            members[call.group] = call.members
    found = []
    for key, ranks_in in members.items():
        those = [r for r in ranks if ranks_in is None or r.rank in ranks_in]
        divergence = _first_difference(those, {r.rank: [c for c in calls[r.rank] if c.group == key] for r in those})
        if divergence is not None:
            found.append(divergence)
    return min(found, key=_earliness, default=None)


def _earliness(divergence: Divergence) -> tuple:
    """How early a divergence is: its collective number, then the earliest step a call there was made in. Each
    rank numbers its collectives of every group in one sequence, so a rank that skips a call of its tp group and
    its peer, left waiting in that call, diverge at one number in two groups (the peer never reaches the next
    call of the default group); the skipped call was made a step earlier than the call the peer never reached."""
    steps = [g.call.step for g in divergence.groups if g.call is not None and g.call.step is not None]
    return divergence.index, min(steps, default=float("inf"))


def _first_difference(ranks: list[RankResult], calls: dict) -> Divergence | None:
    """The first position where the sequences ``calls`` (rank -> its collectives of one group) of ``ranks``
    differ (:func:`first_divergence`)."""
    if len(ranks) < 2:
        return None
    live = [r for r in ranks if r.state not in (RankState.RAISED, RankState.DIED)]
    longest = max((len(c) for c in calls.values()), default=0)
    for i in range(longest):
        groups: dict = {}
        for rank in ranks:
            if i < len(calls[rank.rank]):
                call: Collective = calls[rank.rank][i]
                key, what = call.signature(), (call, None)
            elif rank in live:
                key, what = ("absent", str(rank.state)), (None, _absent(rank))
            else:
                continue
            groups.setdefault(key, [what, []])[1].append(rank.rank)
        if len(groups) > 1:
            ordered = sorted(groups.values(), key=lambda g: (-len(g[1]), g[1][0]))
            odd = tuple(ordered[-1][1]) if len(ordered[-1][1]) < len(ordered[-2][1]) else ()
            index = min(what[0].seq for what, _ in ordered if what[0] is not None)
            return Divergence(index, tuple(DivergenceGroup(tuple(r), *what) for what, r in ordered), odd)
    return None


def _failure_text(rank: RankResult) -> str:
    if rank.state == RankState.DIED:
        return f"rank {rank.rank} {rank.error or 'died'}"
    step = f" at step {rank.last_step}" if rank.last_step is not None else ""
    site = f" at {rank.site}" if rank.site else ""
    return f"rank {rank.rank} raised {rank.error}{site}{step}"


def root_cause(
    ranks: list[RankResult], divergence: Divergence | None, reason: str, deviation: Evidence | None = None
) -> tuple[int | None, str]:
    """Name the rank at fault and what it did (None when the evidence does not show one).

    Order: the earliest failure that is not collateral (where gloo aborted a receiver on a mismatch: the ranks
    that diverged, if the divergence or ``deviation`` shows them; where the ranks raised one exception that names
    the ranks that failed, a DCP ``CheckpointException``: the first it names); else (at the start-up limit) the
    ranks that never joined the process group; else (at the timeout) the ranks still running outside any
    collective; else the odd ranks of the first divergent collective; else the ranks the evidence singles out
    (``deviation``: :func:`ddpfaults.judge.attribution.culprits`); else the earliest collateral failure; else
    where the ranks stood.
    """
    if all(r.state == RankState.FINISHED for r in ranks):
        return None, "no failure"  # even if sequences differ (e.g. Join's shadow collectives), nothing failed
    failed = [r for r in ranks if r.state in (RankState.RAISED, RankState.DIED)]
    failed.sort(key=lambda r: (r.failed_at if r.failed_at is not None else float("inf"), r.rank))
    primary = _faults_first([r for r in failed if not r.collateral])
    if primary:
        # ranks that raised the same error (numbers aside: messages may name the rank) at the same step failed
        # "together": name the lowest, not whichever was quickest
        def how(r):
            return (r.state, re.sub(r"\d+", "#", r.error or ""), r.last_step)

        together = [r for r in primary if how(r) == how(primary[0])]
        first = min(together, key=lambda r: r.rank)
        named = named_ranks(first)
        culprit = next((r for r in failed if named and r.rank == named[0]), None)
        if culprit is not None and all(named_ranks(r) == named for r in together):
            return culprit.rank, (
                f"{_failure_text(culprit)}; the exception {format_ranks([r.rank for r in together])} raised names "
                f"{format_ranks(named)} as failed"
            )
        if gloo_aborted(first):  # gloo aborts the *receiver*; the rank at fault is the one that diverged
            aborted = f"gloo detected the collective mismatch and rank {first.rank} {first.error}"
            if divergence is not None and divergence.odd_ranks:
                odd = divergence.odd_ranks
                shows = f" ({divergence.basis})" if divergence.basis else ""
                return odd[0], f"{format_ranks(odd)} diverged at {divergence.describe()}{shows}; {aborted}"
            if deviation is not None:
                return _deviated(deviation, f"; {aborted}")
            if divergence is not None:
                return None, f"{divergence.blame()}; {aborted}"
            return None, f"{aborted}; nothing shows which rank's collective differed"
        return first.rank, _failure_text(first)
    if reason == "startup":
        joining = [r for r in ranks if r.state == RankState.RUNNING]  # the rest wait in init_process_group
        if joining:
            waiting = [r.rank for r in ranks if r.state == RankState.BLOCKED]
            where = joining[0].where or "outside any collective"
            return joining[0].rank, (
                f"{format_ranks([r.rank for r in joining])} never joined the process group during start-up "
                f"(rank {joining[0].rank} at {where})"
                + (f" while {format_ranks(waiting)} waited in init_process_group" if waiting else "")
            )
    if reason == "timeout":
        running = [r for r in ranks if r.state == RankState.RUNNING]
        if running:
            where = running[0].where or "outside any collective"
            return running[0].rank, (
                f"{format_ranks([r.rank for r in running])} still running outside any collective "
                f"at the timeout (rank {running[0].rank} at {where})"
            )
    if divergence is not None:
        return (divergence.odd_ranks or (None,))[0], divergence.blame()
    if deviation is not None:
        return _deviated(deviation)
    if failed:
        first = failed[0]
        return first.rank, _failure_text(first) + " (a hang symptom: no rank failed first)"
    blocked = [r.rank for r in ranks if r.state == RankState.BLOCKED]
    finished = [r.rank for r in ranks if r.state == RankState.FINISHED]
    if blocked:
        wheres: dict[
            str, list[int]
        ] = {}  # each place the blocked ranks stand (a send to one peer, a recv from another)
        for rank in blocked:
            wheres.setdefault(ranks[rank].where or "an untraced wait", []).append(rank)
        stand = "; ".join(f"{format_ranks(members)} blocked ({where})" for where, members in wheres.items())
        if not finished:
            return None, f"{stand} with no divergent collective recorded"
        at_fault = finished if len(finished) < len(blocked) else blocked
        return at_fault[0], (
            f"{stand} while {format_ranks(finished)} finished without joining; "
            f"no traced collective diverged (wrap models with ctx.ddp to trace DDP's gradient reduction)"
        )
    return None, "no failure"


def _deviated(deviation: Evidence, after: str = "") -> tuple[int | None, str]:
    """The root cause the evidence ``deviation`` gives: the first rank it names and what shows it, or, where it
    names none (symmetric evidence), no rank and why."""
    if not deviation.ranks:
        return None, f"nothing shows which rank diverged: {deviation.shows}{after}"
    return deviation.ranks[0], f"{format_ranks(deviation.ranks)} diverged: {deviation.shows}{after}"


#: what gloo prints when it aborts a receiver whose size check failed: its enforce (every torch), the message newer
#: torch adds to it, and gloo's own hint where it gives one ("Is there a distributed collective mismatch...?")
GLOO_SIZE_CHECK = ("op.preamble.length <= op.nbytes", "Received data size doesn't match expected size", "mismatch")


def named_ranks(rank: RankResult) -> list:
    """The ranks the exception ``rank`` raised names as the ones that failed (its ``failed`` event's ``names``: a DCP
    ``CheckpointException``, which every rank raises alike); [] for any other."""
    return next((e.get("names") or [] for e in rank.events if e.get("k") == "failed"), [])


def gloo_aborted(rank: RankResult) -> bool:
    """True for a rank gloo killed on a collective mismatch (it aborts the receiver whose size check failed)."""
    return rank.state == RankState.DIED and any(text in (rank.error or "") for text in GLOO_SIZE_CHECK)


def _event_time(rank: RankResult, kind: str) -> float | None:
    return next((e["t"] for e in rank.events if e.get("k") == kind), None)


def _faults_first(primary: list[RankResult]) -> list[RankResult]:
    """``primary`` (in failure order) with every rank killed by a signal without a fault of its own moved behind
    the failed ranks on which a fault fired before its exit was seen. A death is dated by the rank's last event,
    the earliest it can have happened: a rank waiting in a collective dated so can seem to die before a peer's
    injected fault that killed it (seen once in 50 soak rounds: a rank's SIGSEGV inside gloo after its peer's
    links were dropped). An exit seen before the fault fired keeps its place."""
    fired = {r.rank: t for r in primary if (t := _event_time(r, "fault")) is not None}

    def may_follow_a_fault(rank: RankResult) -> bool:
        if rank.state != RankState.DIED or rank.rank in fired:
            return False
        exited = _event_time(rank, "exited")
        return any(exited is None or t < exited for other, t in fired.items() if other != rank.rank)

    return [r for r in primary if not may_follow_a_fault(r)] + [r for r in primary if may_follow_a_fault(r)]


def world_outcome(
    ranks: list[RankResult], reason: str, *, deadline: float | None = None, stall: float = 0.0
) -> Outcome:
    """completed if every rank finished; timed out if the hard timeout, ``deadline`` seconds after the start,
    stopped a world still making progress (:func:`progressing`, ``stall`` its window), or it or the start-up limit
    found a rank still starting (:attr:`RankResult.busy` starting: importing, computing; no rank failed); hung if the
    world was stopped otherwise (stall, start-up limit, or a timeout that found it stuck); else crashed."""
    if reason == StopReason.TIMEOUT and deadline is not None and progressing(ranks, deadline, stall):
        return Outcome.TIMED_OUT
    if reason in (StopReason.TIMEOUT, StopReason.STARTUP) and starting(ranks):
        return Outcome.TIMED_OUT
    if StopReason(reason).hung:
        return Outcome.HUNG
    if all(r.state == RankState.FINISHED for r in ranks):
        return Outcome.COMPLETED
    return Outcome.CRASHED


def last_progress(ranks: list[RankResult], until: float = math.inf) -> float | None:
    """When the world last made progress up to ``until``, in seconds since its start (None: nothing recorded):
    the latest event any rank recorded (a step, a collective entered or left, a log, its end, its exit) or
    collective torch's flight recorder saw a rank issue (its ``wall`` time, placed on the world's clock by the
    rank's nearest earlier event carrying both clocks)."""
    times = []
    for rank in ranks:
        times += [e["t"] for e in rank.events if e.get("k") != "killed" and isinstance(e.get("t"), (int, float))]
        pairs = sorted((e["wall"], e["t"]) for e in rank.events if "wall" in e and "t" in e)
        for call in rank.collectives:
            at = bisect.bisect_right(pairs, (call.wall, math.inf)) - 1 if call.wall is not None else -1
            if at >= 0:
                times.append(pairs[at][1] + call.wall - pairs[at][0])
    return max((t for t in times if t <= until), default=None)


def progressing(ranks: list[RankResult], deadline: float, stall: float) -> bool:
    """True if the world was still making progress at ``deadline`` (seconds since its start): no rank raised or
    died, and its :func:`last_progress` came less than ``stall`` seconds before the deadline, or a rank was
    :attr:`~RankResult.busy` then (still starting, or computing: starved of CPU, it writes events seldom; slow, not
    stuck)."""
    if any(r.state in (RankState.RAISED, RankState.DIED) for r in ranks):
        return False
    if any(r.busy is not None for r in ranks):
        return True
    last = last_progress(ranks, until=deadline)
    return last is not None and deadline - last < stall


def starting(ranks: list[RankResult]) -> list[RankResult]:
    """The ranks still starting in a world where no rank raised or died ([] if any did: a failure decides)."""
    if any(r.state in (RankState.RAISED, RankState.DIED) for r in ranks):
        return []
    return [r for r in ranks if r.busy == Busy.STARTING]


def still_starting(ranks: list[RankResult]) -> str:
    """The root cause of a world stopped while ranks were still starting: where each stood (``still starting at the
    deadline: rank 0 importing at "/venv/transformers/__init__.py", line 26 in <module>; ranks 1, 2 waiting (rank 1
    in init_process_group() at train.py:9 in main)``). No culprit: a rank importing or computing is slow, not
    at fault."""
    parts = []
    for rank in starting(ranks):
        if not rank.events:
            parts.append(f"rank {rank.rank} {rank.where or 'starting (no event yet)'}")
        elif rank.stack is None:
            parts.append(f"rank {rank.rank} computing (no stack: it did not get the CPU to answer)")
        else:
            doing = "importing" if is_importing(rank.stack) else "computing"
            where = (innermost_frame(rank.stack) or "an unknown frame").replace("File ", "", 1)
            parts.append(f"rank {rank.rank} {doing} at {where}")
    waiting = [r for r in ranks if r.state == RankState.BLOCKED]
    if waiting:
        parts.append(f"{format_ranks([r.rank for r in waiting])} waiting (rank {waiting[0].rank} {waiting[0].where})")
    return "still starting at the deadline: " + "; ".join(parts)


def still_running(ranks: list[RankResult], deadline: float) -> str:
    """The root cause of a timed-out world: where its live ranks were at ``deadline`` and how recently the world
    last made progress (``still training at the deadline: step 165 on every rank, last progress 0.02 s ago —
    raise the timeout (5 s)``)."""
    live = [r for r in ranks if r.state in (RankState.BLOCKED, RankState.RUNNING)]
    steps = sorted({r.last_step for r in live if r.last_step is not None})
    if not steps:
        text = "still running at the deadline"
    elif len(steps) == 1 and all(r.last_step == steps[0] for r in live):
        on = "every rank" if len(live) == len(ranks) else format_ranks([r.rank for r in live])
        text = f"still training at the deadline: step {steps[0]} on {on}"
    else:
        text = f"still training at the deadline: steps {steps[0]}-{steps[-1]}"
    finished = [r.rank for r in ranks if r.state == RankState.FINISHED]
    if finished:
        text += f" ({format_ranks(finished)} finished)"
    last = last_progress(ranks, until=deadline)
    ago = f", last progress {deadline - last:.2f} s ago" if last is not None else ""
    return f"{text}{ago} — raise the timeout ({deadline:g} s)"


@dataclass(frozen=True)
class Decision:
    """A world's verdict: its outcome, the rank at fault (None: none), the root cause and the first divergence
    shown (None for a world that timed out while still making progress: a snapshot of ranks in motion is no
    divergence)."""

    outcome: Outcome
    root_rank: int | None
    root_cause: str
    divergence: Divergence | None
    cause: Cause | None = None


def decide(
    ranks: list[RankResult],
    divergence: Divergence | None,
    reason: str,
    *,
    deadline: float,
    stall: float,
    deviation: Evidence | None = None,
    cause: Cause | None = None,
) -> Decision:
    """The verdict on ``ranks`` (collateral errors marked), their first ``divergence`` and why the judge stopped
    (``reason``), ``deadline`` being the hard timeout and ``stall`` the stall window, in seconds, and ``deviation``
    the ranks other evidence singles out, ``cause`` what ended the world if no rank's divergence did
    (:func:`ddpfaults.judge.causes.find_cause`): the one place the outcome (:func:`world_outcome`) and the root
    cause (``cause``, else :func:`root_cause`, or :func:`still_running` for a world that timed out) are decided."""
    outcome = world_outcome(ranks, reason, deadline=deadline, stall=stall)
    if outcome == Outcome.TIMED_OUT:
        text = still_starting(ranks) if starting(ranks) else still_running(ranks, deadline)
        return Decision(outcome, None, text, None)
    if cause is not None and outcome != Outcome.COMPLETED:
        return Decision(outcome, cause.culprit, cause.describe(), divergence, cause)
    return Decision(outcome, *root_cause(ranks, divergence, reason, deviation), divergence)


def mark_collateral(ranks: list[RankResult]) -> None:
    """Flag each failed rank whose error is a consequence of a peer's failure or a hang."""
    for rank in ranks:
        rank.collateral = rank.state == RankState.RAISED and is_collateral(rank.error)


def unfired_faults(plan, ranks: list[RankResult], fired) -> list[UnfiredFault]:
    """The faults of ``plan`` (fault values: their ``ranks``, None for every rank) with no ``fired`` record, each
    with the ranks it targets that finished their function all the same (see :class:`UnfiredFault`) and, if any
    did, the hint at why: the fault's seam, if they never used it (:func:`ddpfaults.judge.seams.unused_hint`), else
    the fault's own from the collectives they made at its steps (:meth:`Fault.unfired_hint`)."""
    took = {f.index for f in fired}
    finished = [r.rank for r in ranks if RankState(r.state) == RankState.FINISHED]
    unfired = []
    for i, fault in enumerate(plan):
        if i in took:
            continue
        targeted = tuple(r for r in finished if fault.ranks is None or r in fault.ranks)
        calls = [c for r in ranks if r.rank in targeted for c in r.collectives if fault.applies(r.rank, c.step)]
        hint = seams.unused_hint(fault.seam, [r for r in ranks if r.rank in targeted]) or fault.unfired_hint(calls)
        unfired.append(UnfiredFault(i, repr(fault), targeted, hint if targeted else ""))
    return unfired
