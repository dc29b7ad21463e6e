"""Declaring scenarios: ``@ddpfaults.scenario(...)`` on a module-level rank function.

One declaration form serves the built-in scenarios, users' ``scenario_*.py`` modules,
the pytest plugin and ``python -m ddpfaults matrix``::

    @ddpfaults.scenario(world_size=4, faults=[EmptyBatch(rank=0, step=2)], expect="completed")
    def survives_empty_batch(ctx): ...

    @ddpfaults.scenario(world_size=4, variants=[
        ddpfaults.variant("naive", expect="crashed with KeyError on rank 0", kwargs={"fake": "handmade"}),
        ddpfaults.variant("fixed", expect=ddpfaults.Expect("completed", values_equal=True), kwargs={"fake": "derived"}),
    ])
    def partial_fake_target(ctx, fake): ...

The decorator returns the function unchanged (so it still pickles by reference into the
ranks) with the declaration attached as ``fn.__ddpfaults_scenario__``.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from dataclasses import dataclass, field

from ddpfaults.errors import DDPFaultsError, ExpectationFailed, FaultError, FaultNeverFired, ScenarioError
from ddpfaults.faults import Fault, check_faults
from ddpfaults.judge.results import Outcome, WorldResult
from ddpfaults.spec import RunSpec

ATTRIBUTE = "__ddpfaults_scenario__"


_EXPECT_TEXT = re.compile(
    r"^(?P<outcome>completed|hung|crashed)"
    r"(?: with (?P<error>[\w.]+))?"
    r"(?: on rank (?P<rank>\d+))?"
    r"(?: in (?P<collective>[\w.]+))?$"
)


@dataclass(frozen=True)
class Expect:
    """What a world must do: an outcome, and optionally the root-cause rank, its error type,
    the collective at fault, a root-cause substring, bit-equal return values across ranks, and
    ``checks``: named predicates over the result (see :class:`Check`) for what a verdict alone
    cannot tell (a completed run that violates an invariant, what survivors of a crash kept).

    ``faults_fire`` (default True): every fault of the plan must fire at least once — a fault
    that never fires means the scenario tests nothing, which is reported as a failure.
    """

    outcome: Outcome
    rank: int | None = None
    error: str | None = None
    collective: str | None = None
    root_cause: str | None = None
    values_equal: bool = False
    faults_fire: bool = True
    checks: tuple = ()

    def __post_init__(self):
        try:
            object.__setattr__(self, "outcome", Outcome(self.outcome))
        except ValueError:
            raise ScenarioError(
                f"expect: outcome must be one of completed/hung/crashed, got {self.outcome!r}"
            ) from None

    @classmethod
    def parse(cls, value) -> Expect:
        """An Expect from an Expect, an outcome, or text such as ``"crashed with KeyError on rank 0"``."""
        if isinstance(value, Expect):
            return value
        if isinstance(value, Outcome):
            return cls(value)
        if isinstance(value, str):
            match = _EXPECT_TEXT.match(value.strip())
            if not match:
                raise ScenarioError(
                    f"expect {value!r}: write 'completed', 'hung' or 'crashed', optionally followed by "
                    f"'with ErrorType', 'on rank N', 'in collective' (e.g. 'crashed with KeyError on rank 0')"
                )
            parts = match.groupdict()
            rank = int(parts["rank"]) if parts["rank"] is not None else None
            return cls(parts["outcome"], rank=rank, error=parts["error"], collective=parts["collective"])
        raise ScenarioError(f"expect must be a string or ddpfaults.Expect, got {value!r}")

    def describe(self) -> str:
        """The expectation in the string form ``parse`` accepts (plus flags)."""
        text = str(self.outcome)
        if self.error:
            text += f" with {self.error}"
        if self.rank is not None:
            text += f" on rank {self.rank}"
        if self.collective:
            text += f" in {self.collective}"
        if self.root_cause:
            text += f" (root cause mentions {self.root_cause!r})"
        if self.values_equal:
            text += " (replicas bit-equal)"
        return "; ".join([text, *(getattr(c, "description", repr(c)) for c in self.checks)])

    def mismatches(self, result: WorldResult) -> list[Mismatch]:
        """Every way ``result`` differs from this expectation (empty list: it matched)."""
        found = []
        if result.outcome != self.outcome:
            found.append(Mismatch("outcome", f"expected {self.outcome}, observed {result.outcome}"))
        if self.rank is not None and result.root_rank != self.rank:
            found.append(
                Mismatch("rank", f"expected the root cause on rank {self.rank}, observed rank {result.root_rank}")
            )
        root = result.ranks[result.root_rank] if result.root_rank is not None else None
        if self.error is not None:
            error = (root.error or "") if root is not None else ""
            if not (error.startswith(self.error) or f"{self.error}:" in error or self.error in result.root_cause):
                found.append(Mismatch("error", f"expected error {self.error}, observed {error or result.root_cause!r}"))
        if self.collective is not None:
            ops = result.divergence.ops() if result.divergence is not None else set()
            ops |= {c.op for c in (root.collectives if root is not None else []) if not c.done}
            if self.collective not in ops:
                found.append(
                    Mismatch(
                        "collective",
                        f"expected the collective {self.collective} at fault, observed "
                        f"{sorted(ops) or 'none'} ({result.root_cause})",
                    )
                )
        if self.root_cause is not None and self.root_cause not in result.root_cause:
            found.append(
                Mismatch(
                    "root_cause",
                    f"expected the root cause to mention {self.root_cause!r}, observed {result.root_cause!r}",
                )
            )
        if self.values_equal and result.outcome == Outcome.COMPLETED and len(set(map(repr, result.values))) != 1:
            found.append(
                Mismatch("values", f"expected every rank to return the same value, observed {result.values!r}")
            )
        if self.faults_fire:
            fired = {f.index for f in result.fired}
            found += [
                Mismatch(
                    "fault_never_fired", f"FaultNeverFired: {fault} never fired — the scenario does not exercise it"
                )
                for i, fault in enumerate(result.faults)
                if i not in fired
            ]
        for check in self.checks:
            problem = check(result)
            if problem:
                found.append(
                    Mismatch("check", f"check {getattr(check, 'description', repr(check))!r} failed: {problem}")
                )
        return found

    def verify(self, result: WorldResult) -> None:
        """Raise :class:`~ddpfaults.errors.FaultNeverFired` if the only problem is a fault that never fired,
        :class:`~ddpfaults.errors.ExpectationFailed` for any other mismatch; return if ``result`` matched."""
        found = self.mismatches(result)
        if found:
            kind = FaultNeverFired if all(m.kind == "fault_never_fired" for m in found) else ExpectationFailed
            raise kind(found)


@dataclass(frozen=True)
class Mismatch:
    """One way a world differed from its expectation: what differed (``outcome``, ``rank``, ``error``,
    ``collective``, ``root_cause``, ``values``, ``fault_never_fired``, ``check``) and how, in words."""

    kind: str
    text: str

    def __str__(self) -> str:
        return self.text


@dataclass(frozen=True)
class Check:
    """A named predicate for ``Expect(checks=...)``: ``fn(result)`` returns a problem (text) or None."""

    description: str
    fn: object

    def __call__(self, result) -> str | None:
        try:
            return self.fn(result)
        except Exception as exc:  # a malformed result is a mismatch, not a harness crash
            return f"{type(exc).__name__}: {exc}"


@dataclass(frozen=True)
class Variant:
    """One way to run a scenario (e.g. ``naive`` / ``fixed``); unset fields come from the scenario."""

    name: str
    expect: Expect | None = None
    faults: tuple | None = None
    kwargs: dict = field(default_factory=dict)
    world_size: int | None = None
    peer_failure: str | None = None
    timeout: float | None = None
    stall: float | None = None


def variant(
    name: str, *, expect=None, faults=None, kwargs=None, world_size=None, peer_failure=None, timeout=None, stall=None
) -> Variant:
    """Declare a variant of a scenario; ``kwargs`` are passed to the rank function."""
    if not isinstance(name, str) or not re.fullmatch(r"[\w.-]+", name):
        raise ScenarioError(f"variant name must be a word like 'naive' or 'fixed', got {name!r}")
    return Variant(
        name,
        Expect.parse(expect) if expect is not None else None,
        tuple(faults) if faults is not None else None,
        dict(kwargs or {}),
        world_size,
        peer_failure,
        timeout,
        stall,
    )


@dataclass(frozen=True)
class Case:
    """One runnable item: a scenario, or one variant of it."""

    scenario: Scenario
    variant: Variant | None

    @property
    def id(self) -> str:
        """``name`` or ``name[variant]``."""
        return self.scenario.name + (f"[{self.variant.name}]" if self.variant else "")

    def _pick(self, attr: str):
        value = getattr(self.variant, attr, None) if self.variant else None
        return value if value is not None else getattr(self.scenario, attr)

    @property
    def expect(self) -> Expect:
        """The expectation of this case."""
        return self._pick("expect")

    @property
    def faults(self) -> tuple:
        """The fault plan of this case."""
        return self._pick("faults")

    def resolve(self, defaults: RunSpec) -> CaseRun:
        """What this case runs with: declared values first, then ``defaults``; ScenarioError naming the case."""
        declared = {name: self._pick(name) for name in ("world_size", "timeout", "stall", "peer_failure")}
        try:
            spec = defaults.replace(**declared)
            faults = check_faults(self.faults, spec.world_size)
        except DDPFaultsError as exc:
            raise ScenarioError(f"scenario {self.id}: {exc}") from None
        return CaseRun(spec, faults, {**self.scenario.kwargs, **(self.variant.kwargs if self.variant else {})})

    def run(self, defaults: RunSpec | None = None, *, fit=None, flight_recorder_dir=None) -> WorldResult:
        """Run this case in a real world and return its result; ``fit(spec)`` may shorten even a declared
        timeout (a runner's own limit, e.g. pytest-timeout's); ``flight_recorder_dir`` keeps the ranks' dumps."""
        from ddpfaults.engine.launcher import run_world  # torch is imported only when a world runs

        plan = self.resolve(defaults or RunSpec())
        spec = fit(plan.spec) if fit is not None else plan.spec
        return run_world(
            self.scenario.fn,
            world_size=spec.world_size,
            faults=plan.faults,
            kwargs=plan.kwargs,
            spec=spec,
            flight_recorder_dir=flight_recorder_dir,
        )


@dataclass(frozen=True)
class CaseRun:
    """A case resolved against run defaults: the world's spec, its fault plan, the function's keyword arguments."""

    spec: RunSpec
    faults: tuple
    kwargs: dict


@dataclass(frozen=True)
class Scenario:
    """A declared scenario: the rank function and what running it must produce."""

    fn: object
    name: str
    expect: Expect
    faults: tuple = ()
    world_size: int | None = None
    peer_failure: str | None = None
    timeout: float | None = None
    stall: float | None = None
    kwargs: dict = field(default_factory=dict)
    variants: tuple = ()
    doc: str = ""

    def cases(self) -> list[Case]:
        """One case per variant, or the scenario itself when it has none."""
        return [Case(self, v) for v in self.variants] or [Case(self, None)]


def scenario(
    *,
    world_size=None,
    faults=(),
    expect="completed",
    variants=(),
    peer_failure=None,
    timeout=None,
    stall=None,
    kwargs=None,
    name=None,
):
    """Declare a module-level rank function as a scenario (see the module docstring)."""

    def declare(fn):
        label = name or getattr(fn, "__name__", repr(fn))
        qualname = getattr(fn, "__qualname__", "")
        if not callable(fn) or "<locals>" in qualname or "<lambda>" in qualname:
            raise ScenarioError(f"scenario {label}: must decorate a module-level function, got {fn!r}")
        try:
            declared_faults = tuple(faults)
            for fault in declared_faults:
                if not isinstance(fault, Fault):
                    raise FaultError(f"{fault!r} is not a ddpfaults fault")
            if world_size is not None:
                check_faults(declared_faults, world_size)
            declared = Scenario(
                fn=fn,
                name=label,
                expect=Expect.parse(expect),
                faults=declared_faults,
                world_size=world_size,
                peer_failure=peer_failure,
                timeout=timeout,
                stall=stall,
                kwargs=dict(kwargs or {}),
                variants=tuple(variants),
                doc=(fn.__doc__ or "").strip().splitlines()[0] if fn.__doc__ else "",
            )
            names = [v.name for v in declared.variants]
            if len(set(names)) != len(names):
                raise ScenarioError(f"variant names repeat: {names}")
            for v in declared.variants:
                if not isinstance(v, Variant):
                    raise ScenarioError(f"variants must be made with ddpfaults.variant(...), got {v!r}")
                size = v.world_size or world_size
                if size is not None:
                    check_faults(v.faults if v.faults is not None else declared_faults, size)
        except (DDPFaultsError, TypeError) as exc:
            raise ScenarioError(f"scenario {label}: {exc}") from None
        setattr(fn, ATTRIBUTE, declared)
        return fn

    return declare


def scenarios_in(module) -> list[Scenario]:
    """The scenarios declared in an imported module, in definition order."""
    found = [getattr(v, ATTRIBUTE) for v in vars(module).values() if hasattr(v, ATTRIBUTE)]
    return [s for s in found if getattr(s.fn, "__module__", None) == module.__name__]


def load_module(path: str):
    """Import a scenario module from its file path (its directory goes on sys.path, as pytest's prepend mode does)."""
    path = os.path.abspath(path)
    directory, filename = os.path.split(path)
    module_name = os.path.splitext(filename)[0]
    if directory not in sys.path:
        sys.path.insert(0, directory)
    existing = sys.modules.get(module_name)
    if existing is not None and os.path.abspath(getattr(existing, "__file__", "") or "") == path:
        return existing
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except DDPFaultsError:
        sys.modules.pop(module_name, None)
        raise
    except Exception as exc:
        sys.modules.pop(module_name, None)
        raise ScenarioError(f"scenario module {path} failed to import: {type(exc).__name__}: {exc}") from exc
    return module


def builtin_dir() -> str:
    """The directory holding the built-in scenario modules: the repository's top-level ``scenarios/``, which the
    wheel (and an editable install) maps to the package ``ddpfaults.builtin_scenarios``."""
    spec = importlib.util.find_spec("ddpfaults.builtin_scenarios")
    if spec is not None and spec.submodule_search_locations:
        return list(spec.submodule_search_locations)[0]
    return os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scenarios")  # a bare checkout


def discover(paths=None, pattern: str = "scenario_*.py") -> list[Case]:
    """Every case in the scenario modules under ``paths`` (files or directories; default: the built-ins)."""
    import fnmatch

    files = []
    for path in paths or [builtin_dir()]:
        if os.path.isdir(path):
            for root, _, names in sorted(os.walk(path)):
                files += [os.path.join(root, n) for n in sorted(names) if fnmatch.fnmatch(n, pattern)]
        elif os.path.isfile(path):
            files.append(path)
        else:
            raise ScenarioError(f"scenario path {path!r} does not exist")
    return [case for f in files for s in scenarios_in(load_module(f)) for case in s.cases()]


__all__ = [
    "Check",
    "Expect",
    "Scenario",
    "ScenarioError",
    "Case",
    "Variant",
    "scenario",
    "variant",
    "discover",
    "scenarios_in",
    "load_module",
]
