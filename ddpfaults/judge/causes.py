"""What ended a world when it is no one rank's divergence: pure functions over rank results and the fault plan (no
processes, no torch), each giving a :class:`~ddpfaults.judge.results.Cause` or None.

- **torn file**: a fault that leaves a file torn (``TornDcpWrite``) fired, and the ranks failed reading a checkpoint
  (DCP's ``CheckpointException``, which names the ranks whose reads failed: with AdamW every rank's, since the
  replicated step counters are stored once, in one rank's file); or a checkpoint fault cut a file on disk in an
  attempt before a restart (``WriterKilledMidSave``: its fired record's ``file``) and every rank of the last
  attempt that failed on its own had read that file (its ``file`` events) before it raised. The culprit is the torn
  file's writer.
- **preemption**: a ``Preempt`` sent its notice to every rank, and every rank that failed was ended by it (its
  signal, a ``SystemExit`` or ``KeyboardInterrupt`` its handler raised, or the grace period's SIGKILL), or failed
  only as a consequence. The scheduler stopped the job: no rank is at fault. The outcome stays the one the ranks'
  ends make (crashed).
- **a signal from outside**: ranks were ended by a signal that asks a job to stop (SIGTERM, SIGINT, SIGHUP: the
  signal itself, or the ``SystemExit``/``KeyboardInterrupt`` its handler raised; SIGKILL when two or more died of
  it, as after a scheduler's grace period, for one alone is as likely the kernel's OOM killer), no fault of the plan
  sent a signal, and every other rank finished or failed only as a consequence. A scheduler or an operator stopped
  the job: no rank at fault. (A rank blocked in gloo when the signal comes often fails first on its peers' exits, so
  the evidence seldom shows every rank getting it; the first to die of it is not the cause.)
- **common error**: every rank raised the same exception (numbers in its message aside: a message may name the
  rank) at the same site and step, on its own (none a consequence of a peer's failure, no fault fired on only some
  of them). The code or the environment is at fault, not a rank. A rank that failed as a consequence before it
  joined the process group (on a loaded machine, still connecting gloo's mesh when its peers raised and exited)
  never got as far as the error: it is set aside, if at least two ranks raised it.
"""

from __future__ import annotations

import re

from ddpfaults.judge.ranks import format_ranks
from ddpfaults.judge.results import Cause, FiredFault, RankResult, RankState

_FAILED = (RankState.RAISED, RankState.DIED)


def _named(rank: RankResult) -> list:
    """The ranks the exception ``rank`` raised names as failed (a DCP ``CheckpointException``), else []."""
    return next((e.get("names") or [] for e in rank.events if e.get("k") == "failed"), [])


def torn_file(ranks: list[RankResult], plan=(), *, before: tuple = (), attempt: int | None = None) -> Cause | None:
    """The torn file's writer, when a fault of ``plan`` that leaves one fired and a failed rank's exception names
    the ranks whose checkpoint reads failed, or when every rank that raised read a file a checkpoint fault cut on its
    writer: in this run (a reader that read it while the writer was held torn), or, ``before`` given, in an earlier
    attempt of a restarted world (``attempt``: which; the faults that fired then are the evidence, not the ranks'
    own)."""
    fired = before or [f for r in ranks for f in r.fired]
    torn = [f for f in fired if f.index < len(plan) and plan[f.index].leaves_torn_file]
    readers = [r for r in ranks if RankState(r.state) in _FAILED and _named(r)]
    if torn and readers:
        failed = format_ranks([r.rank for r in readers])
        error = f"the checkpoint load's exception {failed} raised names {format_ranks(_named(readers[0]))} as failed"
        return _torn_cause(torn, error, attempt)
    cut = [f for f in fired if f.file is not None and _wrote(f, plan)]
    raised = [r for r in ranks if RankState(r.state) == RankState.RAISED and not r.collateral]
    if not cut or not raised or not all(_read(r, plan) & {f.file for f in cut} for r in raised):
        return None
    torn = [f for f in cut if any(f.file in _read(r, plan) for r in raised)]
    error = f"{format_ranks([r.rank for r in raised])} read {torn[0].file} and raised {raised[0].error}"
    return _torn_cause(torn, error, attempt)


def _wrote(fired: FiredFault, plan) -> bool:
    """True if ``fired`` is a checkpoint fault's record on its writer (the file it cut), not on a reader."""
    return fired.index < len(plan) and getattr(plan[fired.index], "writer", None) == fired.rank


def _read(rank: RankResult, plan) -> set:
    """The files ``rank`` read: as its ``file`` events recorded them (a job after a restart that follows a
    checkpoint fault records them), and as a checkpoint fault recorded it reading one torn."""
    recorded = {e["path"] for e in rank.events if e.get("k") == "file" and e.get("how") == "read"}
    return recorded | {f.file for f in rank.fired if f.file is not None and not _wrote(f, plan)}


def _torn_cause(torn: list, error: str, attempt: int | None) -> Cause:
    """The cause naming the writer of the torn file (``torn``: the fired faults that tore it, the first one told)."""
    writers = sorted({f.rank for f in torn})
    first = torn[0]
    return Cause(
        "torn_file",
        culprit=writers[0] if len(writers) == 1 else None,
        ranks=tuple(writers),
        error=error,
        step=first.step,
        fault=first.fault,
        how=first.how if attempt is None else f"in attempt {attempt}, before the restart: {first.how}",
    )


#: what a rank raises when a notice's handler (or Python's own, for SIGINT) ends it: no error of the rank's own
_EXITS = ("SystemExit", "KeyboardInterrupt")


def _exits(rank: RankResult) -> bool:
    return RankState(rank.state) == RankState.RAISED and (rank.error or "").startswith(_EXITS)


def preemption(ranks: list[RankResult]) -> Cause | None:
    """The preemption of every rank that ended the world (see the module docstring), or None."""
    notices = [f for r in ranks for f in r.fired if f.effect == "preempted" and f.signal is None]
    notified = {f.rank for f in notices}
    if not ranks or notified != {r.rank for r in ranks}:
        return None
    failed = [r for r in ranks if RankState(r.state) in _FAILED]
    ended = [r.rank for r in failed if RankState(r.state) == RankState.DIED or _exits(r)]
    if not ended or any(r.rank not in ended and not r.collateral for r in failed):
        return None
    expired = sorted({f.rank for r in ranks for f in r.fired if f.effect == "preempted" and f.signal == "SIGKILL"})
    by_notice = [r for r in ended if r not in expired]
    how = []
    if by_notice:
        how.append(f"{format_ranks(by_notice)} {_were(by_notice)} ended by it")
    if expired:
        how.append(f"{format_ranks(expired)} outlived the grace period and {_were(expired)} SIGKILLed")
    others = [r.rank for r in failed if r.rank not in ended]
    if others:
        how.append(f"{format_ranks(others)} failed as a consequence")
    return Cause(
        "preemption",
        ranks=tuple(sorted(notified)),
        step=notices[0].step,
        fault=notices[0].fault,
        how=", ".join(how),
    )


#: the signals that ask a job to stop, by their numbers (Linux's: worlds run on Linux only), as an exit code names
#: them; a rank's own crash dies of SIGABRT, SIGSEGV, SIGBUS... SIGKILL from outside only when it ended two ranks or
#: more (:func:`outside_signal`)
FROM_OUTSIDE = {1: "SIGHUP", 2: "SIGINT", 9: "SIGKILL", 15: "SIGTERM"}


def _signal_that_ended(rank: RankResult) -> str | None:
    """The :data:`FROM_OUTSIDE` signal that ended ``rank``: it died of it (its exit code), or raised the
    ``SystemExit`` a handler raises for it (status 128 + its number) or Python's ``KeyboardInterrupt`` (SIGINT)."""
    state = RankState(rank.state)
    if state == RankState.DIED and rank.exitcode is not None and rank.exitcode < 0:
        return FROM_OUTSIDE.get(-rank.exitcode)
    if state == RankState.RAISED and (rank.error or "").startswith("KeyboardInterrupt"):
        return "SIGINT"
    status = re.fullmatch(r"SystemExit: (\d+)", (rank.error or "").strip())
    if state == RankState.RAISED and status and int(status.group(1)) > 128:
        return FROM_OUTSIDE.get(int(status.group(1)) - 128)
    return None


def outside_signal(ranks: list[RankResult]) -> Cause | None:
    """The signal from outside the world that ended it (see the module docstring), or None."""
    if any(f.signal or f.effect == "preempted" for r in ranks for f in r.fired):
        return None  # ddpfaults sent a signal: the fault's cause, not the outside's
    ended = {r.rank: name for r in ranks if (name := _signal_that_ended(r))}
    if len(set(ended.values())) != 1 or (ended and "SIGKILL" in ended.values() and len(ended) < 2):
        return None
    others = [r for r in ranks if r.rank not in ended]
    if any(RankState(r.state) != RankState.FINISHED and not r.collateral for r in others):
        return None
    consequence = [r.rank for r in others if r.collateral]
    how = f"; {format_ranks(consequence)} failed as a consequence" if consequence else ""
    return Cause("outside_signal", ranks=tuple(sorted(ended)), error=next(iter(ended.values())), how=how)


def _were(ranks: list) -> str:
    return "was" if len(ranks) == 1 else "were"


def _alike(rank: RankResult) -> tuple:
    """What must agree for two ranks' errors to be one: the message up to its numbers (an object's address, hex
    digits and all: ``at 0x7f88f6ed76b0``), the site, the step."""
    return re.sub(r"0x[0-9a-fA-F]+|\d+", "#", rank.error or ""), rank.site, rank.last_step


def _joined(rank: RankResult) -> bool:
    """True if the rank's ``init_process_group`` returned (its events hold the call's exit)."""
    calls = {e.get("seq") for e in rank.events if e.get("k") == "enter" and e.get("op") == "init_process_group"}
    return any(e.get("k") == "exit" and e.get("seq") in calls for e in rank.events)


def common_error(ranks: list[RankResult]) -> Cause | None:
    """Every rank's same exception at the same site and step, each raised on its own, the ranks that failed as a
    consequence before they joined set aside (the module docstring)."""
    unreached = [r.rank for r in ranks if r.collateral and RankState(r.state) in _FAILED and not _joined(r)]
    ranks = [r for r in ranks if r.rank not in unreached]
    if len(ranks) < 2 or any(RankState(r.state) != RankState.RAISED or r.collateral or _named(r) for r in ranks):
        return None
    if len({_alike(r) for r in ranks}) != 1:
        return None
    hit = {f.rank for r in ranks for f in r.fired}
    if hit and hit != {r.rank for r in ranks}:
        return None  # a fault on some ranks only may have made every rank's input what failed
    first = min(ranks, key=lambda r: r.rank)
    differ = any(r.error != first.error for r in ranks)
    return Cause(
        "common_error",
        ranks=tuple(r.rank for r in ranks),
        error=first.error or "",
        site=first.site or "",
        step=first.last_step,
        how=f"rank {first.rank}'s message; the others' differ only in numbers" if differ else "",
        unreached=tuple(unreached),
    )


def find_cause(ranks: list[RankResult], plan=()) -> Cause | None:
    """The first of :func:`torn_file`, :func:`preemption`, :func:`outside_signal` and :func:`common_error` the ranks
    show (None: none)."""
    return torn_file(ranks, plan) or preemption(ranks) or outside_signal(ranks) or common_error(ranks)
