"""The rank context of the job running in this rank process (a warm rank runs many jobs, one context each): the
one the tracing records into and the seams and fault effects act for. Imports nothing of ddpfaults."""

from __future__ import annotations

_current = None  # the running job's RankContext (None outside a job, and in the launcher)


def current():
    """The context of the job running in this rank process (None outside a job, and in the launcher)."""
    return _current


def activate(ctx) -> None:
    """Make ``ctx`` the context the tracing records into and the fault effects act for (None: none)."""
    global _current
    _current = ctx
