"""Hypothesis strategies that draw fault plans: which ranks get which fault at which step.

Importing this module imports `hypothesis <https://hypothesis.readthedocs.io>`_, an optional
dependency (``pip install -e ".[test]"``); ``import ddpfaults`` never does.

A drawn plan is a :class:`FaultPlan`: an immutable, duplicate-free, canonically ordered set of
faults that passes straight to ``run_world(faults=plan)`` and whose ``repr`` is valid Python that
rebuilds it (``eval(repr(plan), plan_namespace())``), so a shrunk counterexample can be pasted into
a regression test::

    from hypothesis import given
    from ddpfaults.strategies import empty_batch_plans

    @given(plan=empty_batch_plans(world_size=4, steps=3))
    def test_fixed_trainer_completes(plan):
        assert run_world(train, world_size=4, faults=plan).outcome == "completed"

Plans shrink toward fewer faults, lower ranks, earlier steps (and the first of ``kinds``).
Strategies compose: :func:`plan_union` merges plans drawn from several strategies, and
:class:`FaultPlan` supports ``+``.
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Iterable, Sequence

import hypothesis.strategies as st
from hypothesis.strategies import SearchStrategy

from ddpfaults import faults as _faults
from ddpfaults.faults import EmptyBatch, Fault, FaultError
from ddpfaults.faults.base import as_plan, check_plan, conflict
from ddpfaults.faults.plan import parse_plan
from ddpfaults.replay import CALL, replay_line

__all__ = [
    "FaultPlan",
    "plan_namespace",
    "fault_plans",
    "whole_step_plans",
    "plan_union",
    "empty_batch_plans",
    "replay",
    "replay_command",
]


def _order(fault: Fault) -> tuple:
    """Canonical order of a plan: by step, then rank, then kind, then the rest of the repr."""
    step = fault.steps[0] if fault.steps else -1
    rank = fault.ranks[0] if fault.ranks else -1
    return (step, rank, type(fault).__name__, repr(fault))


class FaultPlan:
    """A fault plan as a value: a canonically ordered, duplicate-free tuple of faults.

    ``FaultPlan([EmptyBatch(rank=2, step=1), EmptyBatch(rank=0, step=1)])`` keeps the faults sorted
    by (step, rank, kind), so two plans with the same faults are equal and print the same. It is
    iterable (pass it as ``run_world(faults=plan)``), sized, hashable, and ``repr`` rebuilds it. Like any plan
    it is validated by :func:`~ddpfaults.faults.base.check_plan` (repeats merged first): conflicting faults
    are refused.
    """

    __slots__ = ("faults",)

    def __init__(self, faults: Iterable[Fault] = ()):
        try:
            faults = check_plan({repr(f): f for f in as_plan(faults)}.values())
        except FaultError as exc:
            raise FaultError(f"FaultPlan: {exc}") from None
        object.__setattr__(self, "faults", tuple(sorted(faults, key=_order)))

    def __setattr__(self, name, value):
        raise AttributeError("FaultPlan is immutable")

    def __iter__(self):
        return iter(self.faults)

    def __len__(self) -> int:
        return len(self.faults)

    def __eq__(self, other) -> bool:
        return isinstance(other, FaultPlan) and self.faults == other.faults

    def __hash__(self) -> int:
        return hash(self.faults)

    def __add__(self, other: Iterable[Fault]) -> FaultPlan:
        return FaultPlan(self.faults + tuple(other))

    def __repr__(self) -> str:
        return f"FaultPlan([{', '.join(map(repr, self.faults))}])"

    def faults_text(self) -> str:
        """The plan as a plain list, e.g. ``[EmptyBatch(rank=1, step=0)]`` (what ``--faults`` takes)."""
        return "[" + ", ".join(map(repr, self.faults)) + "]"

    def ranks_at(self, step: int, *, world_size: int, kind: type = Fault) -> frozenset:
        """The ranks of a ``world_size`` world that a fault of ``kind`` applies to at ``step``."""
        return frozenset(
            r for r in range(world_size) if any(isinstance(f, kind) and f.applies(r, step) for f in self.faults)
        )

    def steps_of(self, kind: type = Fault) -> tuple:
        """The sorted steps named by faults of ``kind`` (faults without steps are not counted)."""
        return tuple(sorted({s for f in self.faults if isinstance(f, kind) for s in (f.steps or ())}))

    def table(self, *, world_size: int, steps: int, kind: type = Fault) -> str:
        """One line per step: which ranks ``kind`` applies to (``every rank`` / ``none`` / ``ranks 0, 2``)."""
        lines = []
        for step in range(steps):
            ranks = sorted(self.ranks_at(step, world_size=world_size, kind=kind))
            text = (
                "every rank"
                if len(ranks) == world_size
                else ("none" if not ranks else "ranks " + ", ".join(map(str, ranks)))
            )
            lines.append(f"step {step}: {text}")
        return "\n".join(lines)


def _compatible(faults: Iterable[Fault]) -> list:
    """``faults`` in order, leaving out each one that conflicts with one kept before it (a repeat included)."""
    kept: list = []
    for fault in faults:
        if not any(conflict(k, fault) for k in kept):
            kept.append(fault)
    return kept


def plan_namespace() -> dict:
    """The names ``eval`` needs to rebuild a plan from its repr: every public fault class and FaultPlan."""
    names = {
        k: v for k, v in vars(_faults).items() if isinstance(v, type) and issubclass(v, Fault) and not k.startswith("_")
    }
    return {**names, "FaultPlan": FaultPlan}


# -- strategies ------------------------------------------------------------------------------------


def _choices(name: str, value, default: Sequence[int]) -> tuple:
    """``value`` as a sorted tuple of distinct non-negative ints (an int ``n`` means ``range(n)``)."""
    if value is None:
        return tuple(default)
    if isinstance(value, bool):
        raise FaultError(f"{name} must be an int or a sequence of non-negative ints, got {value!r}")
    items = tuple(range(value)) if isinstance(value, int) else tuple(value)
    if not items or any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in items):
        raise FaultError(f"{name} must be a positive int or a non-empty sequence of non-negative ints, got {value!r}")
    return tuple(sorted(set(items)))


def _check_world_size(world_size) -> int:
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise FaultError(f"world_size must be an int >= 1, got {world_size!r}")
    return world_size


def _check_kind(kind):
    if isinstance(kind, type):
        if issubclass(kind, Fault):
            return kind
    elif callable(kind):
        return kind
    raise FaultError(f"kinds: {kind!r} is neither a Fault subclass nor a callable (rank, step) -> Fault")


def _build(draw, kind, rank: int, step: int) -> Fault:
    """One fault of ``kind`` at (rank, step): ``Kind(rank=..., step=...)`` (``writer=`` for checkpoint
    faults), or ``kind(rank, step)`` for a builder, which may return a fault or a strategy of faults."""
    if isinstance(kind, type) and issubclass(kind, Fault):
        return kind(**{kind.rank_arg: rank, "step": step})
    made = kind(rank, step)
    if isinstance(made, SearchStrategy):
        made = draw(made)
    if not isinstance(made, Fault):
        raise FaultError(f"kinds: builder {kind!r} returned {made!r}, not a fault (or a strategy of faults)")
    return made


def fault_plans(
    *,
    world_size: int,
    steps,
    kinds: Sequence = (EmptyBatch,),
    max_faults: int | None = None,
    min_faults: int = 0,
    ranks=None,
) -> SearchStrategy[FaultPlan]:
    """Plans of single-rank, single-step faults: each drawn fault is one (kind, rank, step) cell.

    ``steps``: an int ``n`` (steps ``0..n-1``) or the steps allowed (e.g. a trainer's save steps).
    ``ranks``: the ranks allowed (default every rank of ``world_size``; e.g. ``[0]`` for a writer).
    ``kinds``: fault classes built as ``Kind(rank=r, step=s)`` (``writer=r`` for checkpoint faults),
    or callables ``(rank, step)`` returning a fault or a strategy of faults, e.g.
    ``lambda r, s: st.floats(0.05, 0.2).map(lambda t: Straggler(rank=r, step=s, seconds=t))``.
    At most ``max_faults`` (default: every cell) and at least ``min_faults`` faults; no cell twice. A drawn
    fault that conflicts with one drawn before it (see :func:`~ddpfaults.faults.base.conflict`: e.g. another
    fault on a crashed rank's step) is left out, so a plan may hold fewer than ``min_faults`` faults of several
    kinds. Shrinks toward fewer faults, lower ranks, earlier steps and the first kind.
    """
    world_size = _check_world_size(world_size)
    step_choices = _choices("steps", steps, ())
    rank_choices = _choices("ranks", ranks, range(world_size))
    if rank_choices[-1] >= world_size:
        raise FaultError(f"ranks {list(rank_choices)} name a rank outside a world of {world_size} ranks")
    kinds = tuple(_check_kind(k) for k in kinds)
    if not kinds:
        raise FaultError("kinds must name at least one fault kind")
    cells = len(kinds) * len(rank_choices) * len(step_choices)
    max_faults = cells if max_faults is None else max_faults
    if isinstance(max_faults, bool) or not isinstance(max_faults, int) or max_faults < 0:
        raise FaultError(f"max_faults must be a non-negative int, got {max_faults!r}")
    if isinstance(min_faults, bool) or not isinstance(min_faults, int) or not 0 <= min_faults <= min(max_faults, cells):
        raise FaultError(f"min_faults must be an int in 0..{min(max_faults, cells)}, got {min_faults!r}")
    cell = st.tuples(st.integers(0, len(kinds) - 1), st.sampled_from(rank_choices), st.sampled_from(step_choices))
    chosen = st.lists(cell, min_size=min_faults, max_size=min(max_faults, cells), unique=True)

    @st.composite
    def plans(draw):
        return FaultPlan(_compatible(_build(draw, kinds[k], r, s) for k, r, s in draw(chosen)))

    return plans()


def whole_step_plans(
    *,
    world_size: int,
    steps,
    kind: type = EmptyBatch,
    max_steps: int | None = None,
    min_steps: int = 0,
) -> SearchStrategy[FaultPlan]:
    """Plans in which each chosen step has ``kind`` on every rank (e.g. every rank's batch empty).

    Each chosen step becomes ``world_size`` single-rank faults, so it merges with :func:`fault_plans`
    cell by cell. Shrinks toward fewer and earlier steps.
    """
    world_size = _check_world_size(world_size)
    step_choices = _choices("steps", steps, ())
    if not (isinstance(kind, type) and issubclass(kind, Fault)):
        raise FaultError(f"kind must be a Fault subclass, got {kind!r}")
    max_steps = len(step_choices) if max_steps is None else min(max_steps, len(step_choices))
    if not 0 <= min_steps <= max_steps:
        raise FaultError(f"min_steps must be in 0..{max_steps}, got {min_steps!r}")
    chosen = st.lists(st.sampled_from(step_choices), min_size=min_steps, max_size=max_steps, unique=True)
    return chosen.map(
        lambda ss: FaultPlan(kind(**{kind.rank_arg: r, "step": s}) for s in ss for r in range(world_size))
    )


def plan_union(*strategies: SearchStrategy) -> SearchStrategy[FaultPlan]:
    """One plan holding every fault of one draw from each strategy (duplicates merged; a fault conflicting with
    one of an earlier strategy's plan left out)."""
    if not strategies:
        return st.just(FaultPlan())
    return st.tuples(*strategies).map(lambda plans: FaultPlan(_compatible(f for plan in plans for f in plan)))


def empty_batch_plans(
    *,
    world_size: int,
    steps,
    max_faults: int | None = None,
    whole_steps: bool = True,
    max_whole_steps: int | None = None,
) -> SearchStrategy[FaultPlan]:
    """Plans of :class:`~ddpfaults.faults.EmptyBatch`: scattered empty ranks, plus (``whole_steps``)
    steps on which every rank is empty — which a plan of scattered cells would almost never draw.

    ``steps`` as in :func:`fault_plans` (an int or the allowed steps); at most ``max_whole_steps`` whole
    steps (default: any number; a plan with every step whole trains on nothing). A whole step counts as one drawn
    event, so shrinking prefers one whole step to two scattered faults (fewer events, not fewer faults).
    """
    scattered = fault_plans(world_size=world_size, steps=steps, kinds=(EmptyBatch,), max_faults=max_faults)
    if not whole_steps:
        return scattered
    whole = whole_step_plans(world_size=world_size, steps=steps, kind=EmptyBatch, max_steps=max_whole_steps)
    return plan_union(scattered, whole)


# -- replaying a drawn plan ------------------------------------------------------------------------


def _function_spec(fn) -> str:
    """``path/to/file.py:qualname`` of a module-level function (relative to the current directory)."""
    module = sys.modules.get(getattr(fn, "__module__", ""), None)
    path = getattr(module, "__file__", None)
    name = getattr(fn, "__qualname__", None)
    if not path or not name:
        raise FaultError(f"cannot name {fn!r} for a replay command: not a module-level function of a file")
    rel = os.path.relpath(path)
    return f"{path if rel.startswith('..') else rel}:{name}"


def replay_command(fn, plan: Iterable[Fault], **world) -> str:
    """A shell command that reruns one world (``run_world(fn, faults=plan, **world)``) and prints its report.

    ``world`` holds run_world's keyword arguments (``world_size``, ``seed``, ``kwargs``, ``stall``...);
    their values must have a ``repr`` that rebuilds them (ints, floats, strings, dicts, tuples).
    """
    plan = plan if isinstance(plan, FaultPlan) else FaultPlan(plan)
    call = replay_line(["replay", repr(_function_spec(fn)), f"faults={plan.faults_text()!r}"], world, style=CALL)
    return f"python -c {shlex.quote(f'from ddpfaults.strategies import replay; {call}')}"


def replay(spec: str, *, faults: str = "[]", **world):
    """Rerun the world :func:`replay_command` describes, print its report and return its result."""
    from ddpfaults.engine.launcher import run_world
    from ddpfaults.errors import FaultNeverFired
    from ddpfaults.scenario import load_function

    plan = FaultPlan(parse_plan(faults))
    try:
        result = run_world(load_function(spec), faults=plan, **world)
    except FaultNeverFired as exc:
        print(exc.result.report())
        raise
    print(result.report())
    return result
