"""Restarts: a world that crashes or hangs is started again, whole, as torchrun's agent restarts its workers.

Each attempt gets new rank processes (a function world's next attempt runs on a standby world warmed up while the
attempt before it ran: :func:`ddpfaults.engine.pool.standby`), a fresh store (a new port: a restarted worker never
reads the dead attempt's addresses, pytorch#135712), ``TORCHELASTIC_RESTART_COUNT`` counted, and the same working
directory and files (a function world's ``ctx.shared_dir`` is kept across attempts). Faults act in the attempt they
name (``attempt=0`` by default). The result is the last attempt's, with every attempt summarised in ``attempts``.
With ``check_resume`` a world that was restarted runs again without faults, and the two runs' optimizer steps are
compared (:mod:`ddpfaults.judge.checks.resume`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import tempfile
from collections.abc import Callable

from ddpfaults import engine
from ddpfaults.errors import FaultError
from ddpfaults.expect import require_faults_fired
from ddpfaults.faults import Plan
from ddpfaults.judge.causes import torn_file
from ddpfaults.judge.checks import resume
from ddpfaults.judge.results import Outcome, UnfiredFault, WorldResult

#: the outcomes after which the world is restarted (a world still making progress at its timeout is not: a
#: restart would not finish it sooner)
RESTARTED = (Outcome.CRASHED, Outcome.HUNG)


def summary(result: WorldResult, attempt: int) -> dict:
    """One attempt as the report keeps it: its verdict, the faults that fired, the step each rank reached, its
    seconds (None: not known, an attempt under torchrun that left no verdict)."""
    return {
        "attempt": attempt,
        "outcome": str(result.outcome),
        "reason": result.reason,
        "root_cause": result.root_cause,
        "root_rank": result.root_rank,
        "fired": [f.describe() for f in result.fired],
        "steps": [r.last_step for r in result.ranks],
        "seconds": None if result.elapsed is None else round(result.elapsed, 3),
        "warm": result.warm,
        "preemption": result.preemption,
    }


def check_attempts(plan: Plan, max_restarts: int) -> None:
    """A :class:`~ddpfaults.errors.FaultError` for a fault of an attempt the world can never reach (``attempt`` above
    ``max_restarts``)."""
    for i, fault in enumerate(plan):
        if fault.attempt > max_restarts:
            raise FaultError(
                f"faults[{i}] {fault!r} acts in attempt {fault.attempt}, which a world of max_restarts={max_restarts} "
                f"never reaches (its attempts are 0..{max_restarts}); raise max_restarts or drop the fault"
            )


def run_attempts(start: Callable[[int], WorldResult], plan: Plan, max_restarts: int) -> WorldResult:
    """Run ``start(attempt)`` for attempt 0, and again (at most ``max_restarts`` times) while the world crashes,
    hangs or is preempted (the scheduler requeues a preempted job). An attempt's unfired faults are those of its own
    attempt; faults of attempts never run are reported unfired with no chance. Without restarts the single result
    is returned as it is."""
    if max_restarts == 0:
        result = start(0)
        return dataclasses.replace(result, resume_records=[result.resume_records])
    results = []
    for attempt in range(max_restarts + 1):
        results.append(start(attempt))
        if not restarted(results[-1]):
            break
    return merge(results, plan)


def restarted(result: WorldResult) -> bool:
    """True if an attempt that ended with ``result`` is followed by a restart (while attempts remain)."""
    return result.outcome in RESTARTED or result.preemption is not None


def merge(results: list[WorldResult], plan: Plan) -> WorldResult:
    """The last of a restarted world's attempts (``results``, attempt 0 first), with every attempt in its
    ``attempts`` (:func:`summary`), ``fired`` and ``unfired``: each attempt's unfired faults are those of its own
    attempt; faults of attempts never run are unfired with no chance. Its ``preemption`` is the world's: the last
    attempt's that was preempted (each attempt's own stays in ``attempts``)."""
    unfired = [u for k, r in enumerate(results) for u in own_unfired(r, plan, k)]
    last = _torn_before(results, plan)
    return dataclasses.replace(
        last,
        attempts=[summary(r, k) for k, r in enumerate(results)],
        resume_records=[r.resume_records for r in results],
        unfired=unfired + [UnfiredFault(i, repr(f)) for i, f in enumerate(plan) if f.attempt >= len(results)],
        fired=[f for r in results for f in r.fired],
        preemption=next((r.preemption for r in reversed(results) if r.preemption is not None), None),
    )


def _torn_before(results: list[WorldResult], plan: Plan) -> WorldResult:
    """The last attempt's result, its root cause the writer of a file an earlier attempt tore when the last one
    failed reading it (every rank's ``CheckpointException`` names the ranks whose reads failed, not the writer; every
    rank raising reading a file a checkpoint fault cut looks like a common error, which it is not), and nothing else
    explained its end."""
    last = results[-1]
    if last.outcome == Outcome.COMPLETED or (last.cause is not None and last.cause.kind != "common_error"):
        return last
    for attempt in range(len(results) - 2, -1, -1):
        before = tuple(f for r in results[attempt].ranks for f in r.fired)
        cause = torn_file(last.ranks, plan, before=before, attempt=attempt)
        if cause is not None:
            return dataclasses.replace(last, cause=cause, root_rank=cause.culprit, root_cause=cause.describe())
    return last


def own_unfired(result: WorldResult, plan: Plan, attempt: int) -> list[UnfiredFault]:
    """The faults of ``plan`` that attempt ``attempt`` (judged ``result``) left unfired among those of its own
    attempt (a fault of another attempt never had its chance there)."""
    return [u for u in result.unfired if plan[u.index].attempt == attempt]


def kept_dir(prefix: str, wanted: bool = True):
    """A directory that outlives each attempt of a world and goes with the world (a function world's shared
    directory across restarts), or None when not ``wanted``: a context manager."""
    if not wanted:
        return contextlib.nullcontext()
    return tempfile.TemporaryDirectory(prefix=prefix, ignore_cleanup_errors=True)


def checking_resume(run: Callable[..., WorldResult], plan: Plan, spec) -> WorldResult:
    """``run(plan)``'s result; with ``spec.check_resume``, the finding of :func:`ddpfaults.judge.checks.resume.compare`
    in its ``resume``: when it was restarted, ``run`` again without faults (the uninterrupted run), watching the
    parameters each attempt resumed with (``run(plan, resume_watch)``: where its optimizer and RNG states are
    recorded); a run never restarted resumed nothing (:func:`~ddpfaults.judge.checks.resume.not_resumed`)."""
    if not spec.check_resume:
        return run(plan)
    result = run(plan)
    if len(result.resume_records) < 2:  # one attempt: nothing resumed
        return dataclasses.replace(result, resume=resume.not_resumed(str(result.outcome)))
    baseline = run(Plan((), plan.world_size), resume.watch(result.resume_records))
    if baseline.outcome != Outcome.COMPLETED:
        return dataclasses.replace(result, resume=resume.unchecked(str(baseline.outcome), baseline.root_cause))
    return dataclasses.replace(result, resume=resume.compare(baseline.resume_records[0], result.resume_records))


def finished_world(run: Callable[[Plan], WorldResult], plan: Plan, spec, require_faults_fire: bool) -> WorldResult:
    """How ``run_world`` and ``run_script`` end: ``run(plan)`` (with the resume check when ``spec`` asks:
    :func:`checking_resume`), handed once to the reports (:func:`ddpfaults.engine.finished`), and a
    :class:`~ddpfaults.errors.FaultNeverFired` for a fault that never fired when ``require_faults_fire``."""
    result = checking_resume(run, plan, spec)
    engine.finished(result)
    if require_faults_fire:
        require_faults_fired(result)
    return result
