"""Faults are values: what goes wrong, on which rank, at which step.

Every fault has a keyword-only constructor that validates its arguments, a
``check_world(world_size)`` that validates it against the world it is given to,
and a ``repr`` that is valid Python rebuilding it (so a failing plan can be pasted
into a regression test). Inside a rank, the engine calls ``on_step`` when the
rank announces a step and ``skips_collective`` before each traced collective;
data faults (``EmptyBatch``...) are asked for by scenario code through
``ctx.fault(EmptyBatch)``. Whenever a fault takes effect it is recorded as fired.
"""

from __future__ import annotations

import math
import time
from typing import Iterable

from .errors import FaultError


def _as_tuple(name: str, value, owner: str) -> tuple[int, ...] | None:
    """Normalise an int / iterable of ints / None into a sorted tuple, validating each item."""
    if value is None:
        return None
    try:
        items = (value,) if isinstance(value, int) else tuple(value)
    except TypeError:
        items = (value,)
    for item in items:
        if isinstance(item, bool) or not isinstance(item, int) or item < 0:
            raise FaultError(f"{owner}: {name} must be a non-negative int or a list of them, got {value!r}")
    if not items:
        raise FaultError(f"{owner}: {name} must not be empty")
    return tuple(sorted(set(items)))


def _fmt(values: tuple[int, ...] | None) -> str:
    if values is None:
        return "None"
    return str(values[0]) if len(values) == 1 else repr(list(values))


class Fault:
    """Base class of all faults: a set of ranks and (optionally) a set of steps where it applies.

    ``steps=None`` means every step. Subclasses define the effect.
    """

    #: argument name used for the ranks in ``repr`` (``writer`` for checkpoint faults)
    rank_arg = "rank"

    def __init__(self, *, rank=None, step=None):
        name = type(self).__name__
        self.ranks = _as_tuple(self.rank_arg, rank, name)
        self.steps = _as_tuple("step", step, name)

    def check_world(self, world_size: int) -> None:
        """Raise :class:`FaultError` if this fault names a rank outside a world of ``world_size``."""
        for r in self.ranks or ():
            if r >= world_size:
                raise FaultError(
                    f"{self!r}: {self.rank_arg} {r} does not exist in a world of {world_size} ranks "
                    f"(valid ranks are 0..{world_size - 1})"
                )

    def applies(self, rank: int, step: int | None) -> bool:
        """True if this fault targets ``rank`` at ``step`` (``step=None``: outside any step)."""
        if self.ranks is not None and rank not in self.ranks:
            return False
        if self.steps is None:
            return True
        return step is not None and step in self.steps

    # -- hooks called inside a rank ------------------------------------------------------
    def on_step(self, ctx) -> None:
        """Called when ``ctx.step(i)`` is announced on a rank and step this fault applies to."""

    def skips_collective(self, ctx, op: str) -> bool:
        """Return True to make the rank skip collective ``op`` (called only where the fault applies)."""
        return False

    # -- values --------------------------------------------------------------------------
    def _fields(self) -> dict:
        fields = {self.rank_arg: _fmt(self.ranks)}
        if self.steps is not None:
            fields["step"] = _fmt(self.steps)
        return fields

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v}" for k, v in self._fields().items() if v != "None")
        return f"{type(self).__name__}({args})"

    def __eq__(self, other) -> bool:
        return type(self) is type(other) and repr(self) == repr(other)

    def __hash__(self) -> int:
        return hash(repr(self))


def _require_step(fault: Fault) -> None:
    if fault.steps is None:
        raise FaultError(f"{type(fault).__name__}: step is required")


def _require_rank(fault: Fault) -> None:
    if fault.ranks is None:
        raise FaultError(f"{type(fault).__name__}: {fault.rank_arg} is required")


class RankCrash(Fault):
    """``rank`` raises ``exc`` when it announces ``step``.

    ``exc`` is an exception instance or class (default ``RuntimeError("injected crash")``);
    it must be picklable since it travels to the rank.
    """

    def __init__(self, *, rank, step, exc: BaseException | type | None = None):
        super().__init__(rank=rank, step=step)
        _require_rank(self)
        _require_step(self)
        if exc is None:
            exc = RuntimeError("injected crash")
        if isinstance(exc, type) and issubclass(exc, BaseException):
            exc = exc("injected crash")
        if not isinstance(exc, BaseException):
            raise FaultError(f"RankCrash: exc must be an exception instance or class, got {exc!r}")
        self.exc = exc

    def on_step(self, ctx) -> None:
        """Raise the configured exception."""
        raise self.exc

    def _fields(self) -> dict:
        return {**super()._fields(), "exc": f"{type(self.exc).__name__}({', '.join(map(repr, self.exc.args))})"}


class Straggler(Fault):
    """``rank`` computes hard (burning CPU, not sleeping) for ``seconds`` at ``step``."""

    def __init__(self, *, rank, step, seconds: float):
        super().__init__(rank=rank, step=step)
        _require_rank(self)
        _require_step(self)
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 < seconds < math.inf:
            raise FaultError(f"Straggler: seconds must be a positive finite number, got {seconds!r}")
        self.seconds = float(seconds)

    def on_step(self, ctx) -> None:
        """Busy-loop on the CPU for the configured time."""
        end = time.monotonic() + self.seconds
        x = 0
        while time.monotonic() < end:
            for i in range(10_000):
                x += i * i

    def _fields(self) -> dict:
        return {**super()._fields(), "seconds": repr(self.seconds)}


class SkippedCollective(Fault):
    """``rank`` silently skips the first collective (optionally only of kind ``op``) at ``step``."""

    def __init__(self, *, rank, step, op: str | None = None):
        super().__init__(rank=rank, step=step)
        _require_rank(self)
        _require_step(self)
        if op is not None and not isinstance(op, str):
            raise FaultError(f"SkippedCollective: op must be a collective name like 'all_reduce', got {op!r}")
        self.op = op

    def skips_collective(self, ctx, op: str) -> bool:
        """Skip once per (rank, step): the first matching collective."""
        if self.op is not None and op != self.op:
            return False
        return ctx._once(self)

    def _fields(self) -> dict:
        fields = super()._fields()
        if self.op is not None:
            fields["op"] = repr(self.op)
        return fields


class RankOnlyBarrier(Fault):
    """``rank`` alone calls ``dist.barrier()`` at ``step`` (e.g. ``if rank == 0: dist.barrier()``)."""

    def __init__(self, *, rank, step):
        super().__init__(rank=rank, step=step)
        _require_rank(self)
        _require_step(self)

    def on_step(self, ctx) -> None:
        """Enter a barrier the other ranks never call."""
        import torch.distributed as dist

        dist.barrier()


def check_faults(faults: Iterable[Fault], world_size: int) -> tuple[Fault, ...]:
    """Validate a fault plan against a world; return it as a tuple."""
    faults = tuple(faults)
    for i, fault in enumerate(faults):
        if not isinstance(fault, Fault):
            raise FaultError(f"faults[{i}] is {fault!r}, not a ddpfaults fault (see ddpfaults.faults)")
        fault.check_world(world_size)
    return faults
