"""The fault base class and the argument validation every fault kind shares.

A fault is a value: a set of ranks, optionally a set of steps, and (in a subclass) an effect.
Its constructor is keyword-only and validates its arguments, ``check_world(world_size)``
validates it against a world, and its ``repr`` is valid Python rebuilding it.
"""

from __future__ import annotations

from collections.abc import Iterable

from ddpfaults.errors import FaultError


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
    """``values`` as it appears in a repr: ``None``, a bare int, or a list."""
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

    # -- hooks called at torch's seams inside a rank (where the fault applies, unless claimed by ctx.fault) ----
    def on_batch(self, batch):
        """A batch a DataLoader yields, replaced by what this fault makes of it; None: no effect."""
        return None

    #: how many batches each DataLoader iterator yields before it stops (None: no limit)
    batch_limit: int | None = None

    def ddp_kwargs(self, rank: int, args: tuple, kwargs: dict) -> dict | None:
        """The keyword arguments ``DistributedDataParallel(module, *args, **kwargs)`` gets instead; None: no effect."""
        return None

    def acts_on_ddp_buckets(self, rank: int) -> bool:
        """True if this fault may act on ``rank``'s DDP gradient buckets (DDP then gets ddpfaults' comm hook)."""
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
    """Raise :class:`FaultError` unless ``fault`` was given a step."""
    if fault.steps is None:
        raise FaultError(f"{type(fault).__name__}: step is required")


def _require_rank(fault: Fault) -> None:
    """Raise :class:`FaultError` unless ``fault`` was given a rank (or writer)."""
    if fault.ranks is None:
        raise FaultError(f"{type(fault).__name__}: {fault.rank_arg} is required")


def check_faults(faults: Iterable[Fault], world_size: int) -> tuple[Fault, ...]:
    """Validate a fault plan against a world; return it as a tuple."""
    faults = tuple(faults)
    for i, fault in enumerate(faults):
        if not isinstance(fault, Fault):
            raise FaultError(f"faults[{i}] is {fault!r}, not a ddpfaults fault (see ddpfaults.faults)")
        fault.check_world(world_size)
    return faults
