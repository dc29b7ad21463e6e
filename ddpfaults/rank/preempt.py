"""Preemption inside a rank: the notice a scheduler sends (``Preempt``), the SIGKILL when its grace period runs out,
and the checkpoints a rank saves (each completed ``torch.save`` to a file, ``dcp.save`` and ``dcp.async_save`` is a
``saved`` event, so a report can say whether a preempted rank saved and how many steps were lost)."""

from __future__ import annotations

import os
import signal
import threading
import time

import torch

from ddpfaults.rank import dcp, running


def _saved(ctx, step, file, began: float) -> None:
    """Record a completed save of the running job (``step``: its step when the save began; ``file``: the file's or
    the checkpoint directory's name; ``began``: when it began, on the monotonic clock: the event's ``took`` is how
    long before its end, so that a save begun before a preemption notice is not taken for one made after it)."""
    ctx._events.emit("saved", step=step, file=file, took=round(time.monotonic() - began, 6))


def track_saves() -> None:
    """Make this process's ``torch.save`` to a file, ``dcp.save`` and ``dcp.async_save`` (once its upload completes)
    record a ``saved`` event in the running job (once per process; inert between jobs)."""
    dcp.track_saves(_saved)
    original = torch.save
    if getattr(original, "__ddpfaults_saves__", False):
        return

    def save(obj, f, *args, **kwargs):
        """torch.save, then a ``saved`` event (a save to a path only: a buffer is no checkpoint)."""
        ctx = running.current()
        step, began = (ctx.current_step if ctx is not None else None), time.monotonic()
        done = original(obj, f, *args, **kwargs)  # a thread's save may end steps later: the step is when it began
        if ctx is not None and running.current() is ctx and isinstance(f, (str, os.PathLike)):
            _saved(ctx, step, os.path.basename(os.fspath(f)), began)
        return done

    save.__ddpfaults_saves__ = True
    save.__doc__, save.__name__, save.__wrapped__ = original.__doc__, original.__name__, original
    torch.save = save


_notified = None  # the job whose rank got a preemption notice (a RankContext), None before one


def notified(ctx) -> bool:
    """True if the rank got a preemption notice in the job of ``ctx``."""
    return ctx is not None and _notified is ctx


def deliver(ctx, fault) -> None:
    """Send the rank its preemption notice now, and SIGKILL it ``fault.grace`` seconds later if its job is still
    running then."""
    global _notified
    _notified = ctx
    ctx.record_fired(
        fault,
        f"sent {fault.signal.name} as a scheduler preempting the job does (SIGKILL after {fault.grace:g} s)",
        effect="preempted",
    )

    def expire():
        if running.current() is not ctx:  # the job ended in time
            return
        how = f"SIGKILLed: still running {fault.grace:g} s after {fault.signal.name}"
        ctx.record_fired(fault, how, effect="preempted", signal="SIGKILL")
        os.kill(os.getpid(), signal.SIGKILL)

    timer = threading.Timer(fault.grace, expire)
    timer.name, timer.daemon = "ddpfaults-preempt-grace", True
    timer.start()
    notify(fault.signal)  # returns only if the code under test handles the signal


def notify(signum) -> None:
    """Send this process ``signum`` as a scheduler does. A torchrun worker holds SIGTERM, SIGINT and SIGHUP blocked
    in every thread (its signal thread takes torchrun's): the notice then goes to this thread alone, unblocked for
    the moment, so that the code under test's handler runs (or, with none, the signal ends the rank), as locally."""
    if signum not in signal.pthread_sigmask(signal.SIG_BLOCK, []):
        os.kill(os.getpid(), signum)
        return
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signum])
    try:
        signal.pthread_kill(threading.get_ident(), signum)  # delivered before it returns: unblocked, to this thread
    finally:
        signal.pthread_sigmask(signal.SIG_BLOCK, [signum])
