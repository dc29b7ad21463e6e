"""The fault base class, the argument validation every fault kind shares, and the validation of a plan.

A fault is a value: a set of ranks, optionally a set of steps, and (in a subclass) an effect.
Its constructor is keyword-only and validates its arguments (a positional, unknown or missing argument is a
:class:`~ddpfaults.errors.FaultArgumentError`), ``check_world(world_size)`` validates it against a world, and
its ``repr`` is valid Python rebuilding it. :func:`check_plan` validates a plan (a list of faults, no two in
conflict), :func:`check_faults` a plan against a world: the one place plans are validated, into a :class:`Plan`
that is carried from there on.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Iterable, Mapping

from ddpfaults.errors import FaultArgumentError, FaultError


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


def _keyword_only(init):
    """``init`` refusing a positional, unknown or missing argument with a :class:`FaultArgumentError` naming the
    fault and the arguments it takes (instead of Python's bare TypeError)."""
    signature = inspect.signature(init)
    names = [p.name for p in list(signature.parameters.values())[1:]]

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        attempt = kwargs.pop("attempt", 0)
        unknown = [k for k in kwargs if k not in names]
        try:
            if unknown:
                raise TypeError(f"unknown argument {unknown[0]!r}")
            signature.bind(self, *args, **kwargs)
        except TypeError as exc:
            name = type(self).__name__
            raise FaultArgumentError(
                f"{name}: {exc} ({name}'s arguments, keyword-only: {', '.join(names) or 'none'})"
            ) from None
        if isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 0:
            raise FaultError(
                f"{type(self).__name__}: attempt must be a non-negative int (0: the first run), got {attempt!r}"
            )
        init(self, *args, **kwargs)
        self.attempt = attempt

    return __init__


class Fault:
    """Base class of all faults: a set of ranks and (optionally) a set of steps where it applies.

    ``steps=None`` means every step. Subclasses define the effect.
    """

    #: argument name used for the ranks in ``repr`` (``writer`` for checkpoint faults)
    rank_arg = "rank"
    #: the run of a restarted world it acts in (every fault takes ``attempt=N``, keyword-only; 0: the first run,
    #: so a kill is not repeated by every restart)
    attempt = 0
    #: True for a fault that ends its rank at a step it names, as it starts or at a collective of it (``RankCrash``,
    #: ``RankKilled``): no other fault can act on that rank at that step (see :func:`conflict`)
    ends_rank = False
    #: True for a fault that only changes the data a rank sees (which batches, what is in them) and leaves nothing
    #: behind in the rank process once its job ends: a world that completed cleanly under a plan of such faults
    #: goes back to the pool like a fault-free one (see :attr:`Plan.data_only`). Each class
    #: declares it itself: a subclass that does not is not data-only (it may add an effect of its own).
    data_only = False
    #: True for a fault that leaves behind, where it fires, a file its rank wrote torn that every rank reads later
    #: (``TornDcpWrite``): a read of it failing on any rank is the writer's doing (ddpfaults.judge.causes)
    leaves_torn_file = False
    #: the seam of torch this fault acts through, one of ``ddpfaults.judge.seams.SEAMS`` (None: no one seam): a fault
    #: that never fired on ranks that never used it says so, naming the seams they did use
    seam: str | None = None

    @property
    def kills_with(self) -> str | None:
        """The name of the signal this fault kills its rank with when it fires (None: it kills nothing)."""
        return None

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "__init__" in cls.__dict__:
            cls.__init__ = _keyword_only(cls.__dict__["__init__"])

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

    @property
    def effect_ranks(self) -> tuple[int, ...] | None:
        """The ranks whose one event this fault's effect takes (None: every rank), for :meth:`same_effect`."""
        return self.ranks

    def same_effect(self, other: Fault) -> str | None:
        """What this fault and ``other`` would both do to one event at a rank and step they share, when only the
        first could (e.g. ``"empty the batch"``); None when they compose. See :func:`conflict`."""
        return None

    # -- hooks called inside a rank ------------------------------------------------------
    def arm(self, ctx) -> None:
        """Called when a step this fault applies to starts, before :meth:`on_step`: prepare an effect that comes
        later in the step (checkpoint faults arm the torch.save interception). Arming is not firing: whoever
        carries the effect out records it."""

    def on_step(self, ctx) -> None:
        """Called when ``ctx.step(i)`` is announced on a rank and step this fault applies to, if :attr:`acts_on_step`
        (it is recorded as fired before the call)."""

    @property
    def acts_on_step(self) -> bool:
        """True if the fault takes effect as its step starts: its class overrides :meth:`on_step`."""
        return type(self).on_step is not Fault.on_step

    def skips_collective(self, ctx, op: str, maker: str = "user") -> bool:
        """Return True to make the rank skip collective ``op`` made by ``maker`` (a key of
        :data:`ddpfaults.events.MAKERS`; called only where the fault applies)."""
        return False

    def before_collective(self, ctx, op: str, maker: str = "user") -> str | None:
        """Act as the rank enters collective ``op`` made by ``maker`` (called where the fault applies, unless a skip
        took it); return
        what was done (recorded as fired), None for no effect. ``SlowLink``, ``DroppedLink``."""
        return None

    # -- hooks called at torch's seams inside a rank (where the fault applies, unless claimed by ctx.fault) ----
    def on_batch(self, batch):
        """A batch a DataLoader yields, replaced by what this fault makes of it; None: no effect."""
        return None

    #: how many batches each DataLoader iterator yields before it stops (None: no limit)
    batch_limit: int | None = None

    def ddp_kwargs(self, rank: int, args: tuple, kwargs: dict) -> dict | None:
        """The keyword arguments ``DistributedDataParallel(module, *args, **kwargs)`` gets instead; None: no effect."""
        return None

    def unfired_hint(self, calls: list) -> str:
        """Why this fault may never have fired, for its never-fired message ("": nothing to add); ``calls``: the
        collectives its ranks made at its steps (the judge's ``Collective`` records: ``op``, ``maker``...)."""
        return ""

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
        fields = self._fields() | ({"attempt": str(self.attempt)} if self.attempt else {})
        args = ", ".join(f"{k}={v}" for k, v in fields.items() if v != "None")
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


Fault.__init__ = _keyword_only(Fault.__init__)


def _common(mine, theirs, every: bool):
    """The values (ranks or steps) two faults both name: a sorted tuple, ``()`` when they share none, None for
    every value. A None side (every value) shares all the other's values if ``every``, none otherwise."""
    if mine is None or theirs is None:
        if not every:
            return ()
        return mine if theirs is None else theirs
    return tuple(sorted(set(mine) & set(theirs)))


def _where(ranks, steps) -> str:
    def values(word: str, items) -> str:
        if items is None:
            return f"every {word}"
        return f"{word} {items[0]}" if len(items) == 1 else f"{word}s {', '.join(map(str, items))}"

    return f"on {values('rank', ranks)} at {values('step', steps)}"


def conflict(first: Fault, second: Fault) -> str | None:
    """Where and why ``first`` and ``second`` cannot both act as planned (``"on rank 1 at step 2: both empty the
    batch, ..."``), or None when they compose.

    Two faults conflict when, on a rank and step they share, one of them could never take effect:

    - a fault that ends its rank at the step (``RankCrash``, ``RankKilled``: as it starts, or at its ``op``) and any
      other fault that names that rank and that step explicitly: two crashes, a crash and a kill, a crash and an
      ``EmptyBatch``, a ``Straggler``, a ``SkippedCollective``, a checkpoint fault of that writer... (what acts
      would depend on the plan's order, which ``FaultPlan`` sorts);
    - two faults taking the same single event (:meth:`Fault.same_effect`): two ``EmptyBatch`` (one batch to
      empty), two ``SchemaDrift`` of the same key, two ``DeviceMismatch`` (one DDP construction), two
      ``UnevenInputs`` of a rank, two ``SkippedCollective`` whose ops overlap (both claim the first matching
      collective), a ``RankOnlyBarrier`` and a ``SkippedCollective`` of ``op=None`` or ``"barrier"`` (the skip
      would swallow the lone barrier), two ``RankOnlyBarrier``, two checkpoint faults at one step (one save
      handshake per step), two ``OutOfMemory`` (one limit), two ``DroppedLink`` whose ops overlap, a
      ``SlowLink`` or ``DroppedLink`` and a ``SkippedCollective`` whose ops overlap (the skip swallows the
      collective). Here a fault without ranks or steps shares every rank or step.

    Everything else composes: faults on different ranks or steps; a fault of every rank (``rank=None``) or of
    every step with a crash on one rank or step (it still acts elsewhere); ``Straggler`` with anything but a
    crash or kill (two Stragglers add up); ``EmptyBatch`` with ``SchemaDrift``; ``SchemaDrift`` of different
    keys; ``SkippedCollective`` of different ops (``op=None`` never skips a DDP bucket, so it composes with
    ``op="ddp_bucket"``); a ``WriterKilledMidSave`` with faults acting earlier in its step.
    Faults of different attempts (restarts) never conflict.
    """
    if first.attempt != second.attempt:
        return None
    if first.ends_rank or second.ends_rank:
        ranks, steps = _common(first.ranks, second.ranks, False), _common(first.steps, second.steps, False)
        if ranks and steps:
            ender, other = (first, second) if first.ends_rank else (second, first)
            if other.ends_rank:
                return f"{_where(ranks, steps)}: both end the rank when the step starts, so only the first would act"
            return (
                f"{_where(ranks, steps)}: {type(ender).__name__} ends the rank when the step starts, so "
                f"{type(other).__name__} could never act there"
            )
    effect = first.same_effect(second) or second.same_effect(first)
    if effect:
        ranks = _common(first.effect_ranks, second.effect_ranks, True)
        steps = _common(first.steps, second.steps, True)
        if ranks != () and steps != ():
            return f"{_where(ranks, steps)}: both {effect}, so only the first would act and the other never fire"
    return None


def as_plan(faults) -> tuple[Fault, ...]:
    """A fault plan (a list, tuple, :class:`~ddpfaults.strategies.FaultPlan` or any iterable of faults) as a
    tuple of faults; a :class:`~ddpfaults.errors.FaultError` for anything else (a lone fault, a string, a dict,
    None, an item that is not a fault). Conflicts are :func:`check_plan`'s."""
    if isinstance(faults, Fault):
        raise FaultError(f"faults must be a list of faults; got {faults!r} — wrap it in a list: faults=[{faults!r}]")
    if faults is None or isinstance(faults, (str, bytes, Mapping)):
        what = "None (use [] for no faults)" if faults is None else f"{type(faults).__name__} {faults!r}"
        raise FaultError(f"faults must be a list of faults like [EmptyBatch(rank=1, step=2)]; got {what}")
    try:
        faults = tuple(faults)
    except TypeError:
        raise FaultError(f"faults must be a list of faults like [EmptyBatch(rank=1, step=2)]; got {faults!r}") from None
    for i, fault in enumerate(faults):
        if not isinstance(fault, Fault):
            raise FaultError(f"faults[{i}] is {fault!r}, not a ddpfaults fault (see ddpfaults.faults)")
    return faults


class Plan(tuple):
    """A validated fault plan: its faults in the order given (a fault's index is its place in the plan, as fired
    events and reports name it), no two in :func:`conflict`; ``world_size``: the world it was checked against (None:
    none yet). Made where a plan enters (a call, a declaration, ``--faults``) by :func:`check_plan` or
    :func:`check_faults`, and carried as it is: checking it again for the same world does nothing. Equal to the tuple
    of its faults; pickled as it is (a rank takes it unchecked)."""

    world_size: int | None

    def __new__(cls, faults: Iterable[Fault] = (), world_size: int | None = None):
        plan = super().__new__(cls, faults)
        plan.world_size = world_size
        return plan

    def __reduce__(self):
        return (Plan, (tuple(self), self.world_size))

    @property
    def data_only(self) -> bool:
        """True if every fault of the plan (none: True) only changes the data its ranks see: its class declares
        :attr:`Fault.data_only` itself (a subclass inheriting it is not). Such a plan runs on a warm world and leaves
        it fit for the next run."""
        return all(vars(type(fault)).get("data_only", False) is True for fault in self)


def check_plan(faults) -> Plan:
    """A fault plan (:func:`as_plan`) validated without a world: no two of its faults in :func:`conflict`. A
    :class:`~ddpfaults.errors.FaultError` names both faults otherwise; a :class:`Plan` is returned as it is."""
    if isinstance(faults, Plan):
        return faults
    faults = as_plan(faults)
    for j, second in enumerate(faults):
        for i, first in enumerate(faults[:j]):
            why = conflict(first, second)
            if why:
                raise FaultError(
                    f"faults[{i}] {first!r} and faults[{j}] {second!r} conflict {why}; "
                    f"move one to another rank or step, or drop one"
                )
    return Plan(faults)


def check_faults(faults: Iterable[Fault], world_size: int) -> Plan:
    """A fault plan (:func:`check_plan`) validated against a world of ``world_size`` ranks; a :class:`Plan` already
    checked against that world is returned as it is."""
    plan = check_plan(faults)
    if plan.world_size == world_size:
        return plan
    for fault in plan:
        fault.check_world(world_size)
    return Plan(plan, world_size)
