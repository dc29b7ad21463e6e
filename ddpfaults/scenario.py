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

import contextlib
import importlib
import importlib.util
import os
import re
import sys
from dataclasses import dataclass, field

from ddpfaults.errors import DDPFaultsError, ScenarioError
from ddpfaults.expect import Expect
from ddpfaults.faults import check_faults
from ddpfaults.faults.base import check_plan
from ddpfaults.judge.results import WorldResult
from ddpfaults.replay import describe_function
from ddpfaults.spec import (
    SCENARIO,
    RunSpec,
    check_arguments,
    check_call,
    check_declared,
    check_step_clock,
    settable,
    settings_given,
)

ATTRIBUTE = "__ddpfaults_scenario__"
SETTINGS = tuple(p.name for p in settable(SCENARIO))  # the run settings a scenario or variant may declare


def _settings(call: str, given: dict) -> dict:
    """The run settings a declaration gives (None: not declared), once each is one a scenario may declare."""
    return settings_given(call, given, SETTINGS)


@dataclass(frozen=True)
class Variant:
    """One way to run a scenario (e.g. ``naive`` / ``fixed``); unset fields come from the scenario."""

    name: str
    expect: Expect | None = None
    faults: tuple | None = None
    kwargs: dict = field(default_factory=dict)
    settings: dict = field(default_factory=dict)  # the run settings it declares (:data:`SETTINGS`)
    argv: tuple | None = None


def variant(name: str, *, expect=None, faults=None, kwargs=None, argv=None, **settings) -> Variant:
    """Declare a variant of a scenario; ``kwargs`` are passed to the rank function, ``argv`` to a script; the other
    keywords are run settings (:data:`SETTINGS`). Its settings and keyword arguments are checked when the scenario
    is declared (the error names both)."""
    if not isinstance(name, str) or not re.fullmatch(r"[\w.-]+", name):
        raise ScenarioError(f"variant name must be a word like 'naive' or 'fixed', got {name!r}")
    try:
        faults = check_plan(faults) if faults is not None else None
    except DDPFaultsError as exc:
        raise ScenarioError(f"variant {name}: {exc}") from None
    return Variant(
        name,
        Expect.parse(expect) if expect is not None else None,
        faults,
        kwargs if kwargs is not None else {},
        _settings("variant", settings),
        _argv(argv, f"variant {name}") if argv is not None else None,
    )


def _argv(argv, where: str) -> tuple:
    if not isinstance(argv, (list, tuple)) or not all(isinstance(a, str) for a in argv):
        raise ScenarioError(f"{where}: argv must be a list of strings (the script's arguments), got {argv!r}")
    return tuple(argv)


def case_id(scenario: str, variant: str = "") -> str:
    """A case's id: ``scenario`` or ``scenario[variant]``."""
    return scenario + (f"[{variant}]" if variant else "")


@dataclass(frozen=True)
class Case:
    """One runnable item: a scenario, or one variant of it."""

    scenario: Scenario
    variant: Variant | None

    @property
    def id(self) -> str:
        """``name`` or ``name[variant]``."""
        return case_id(self.scenario.name, self.variant.name if self.variant else "")

    def _pick(self, attr: str):
        value = getattr(self.variant, attr, None) if self.variant else None
        return value if value is not None else getattr(self.scenario, attr)

    @property
    def settings(self) -> dict:
        """The run settings this case declares: the scenario's, overlaid by its variant's."""
        return {**self.scenario.settings, **(self.variant.settings if self.variant else {})}

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
        try:
            spec = defaults.replace(**self.settings)
            if self.expect is not None and self.expect.checks_resume:  # an expected finding needs the check
                spec = spec.replace(check_resume=True)
            faults = check_faults(self.faults, spec.world_size)
            _check_rank(self.expect, spec.world_size)
        except DDPFaultsError as exc:
            raise ScenarioError(f"scenario {self.id}: {exc}") from None
        kwargs = {**self.scenario.kwargs, **(self.variant.kwargs if self.variant else {})}
        scenario = self.scenario
        function = describe_function(scenario.fn) if scenario.fn else os.path.relpath(scenario.script)
        return CaseRun(spec, faults, kwargs, self._pick("argv"), function)

    def run(self, defaults: RunSpec | None = None, *, fit=None, flight_recorder_dir=None, cwd=None) -> WorldResult:
        """Run this case in a real world and return its result; ``fit(spec)`` may shorten even a declared
        timeout (a runner's own limit, e.g. pytest-timeout's); ``flight_recorder_dir`` keeps the ranks' dumps.
        A script case runs in ``cwd``, else the directory its scenario declares, else a fresh empty one removed
        after the world (:func:`world_directory`).

        The fork server is machinery, not the case: the first case waits for it (importing torch takes seconds
        on a cold or busy machine) before its own clock starts, so no verdict depends on how fast it starts.
        Faults that never fired are the case's ``Expect``'s to judge (``faults_fire``), not an error here."""
        from ddpfaults.engine import pool, world
        from ddpfaults.engine.launcher import FunctionTarget  # torch is imported only when a world runs

        plan = self.resolve(defaults or RunSpec())
        if plan.spec.start_method == "forkserver":
            pool.fork_server_ready(timeout=plan.spec.timeout)
        spec = fit(plan.spec) if fit is not None else plan.spec
        with contextlib.ExitStack() as stack:
            if self.scenario.script is not None:
                from ddpfaults.engine.scripts import ScriptRun, world_directory

                directory = stack.enter_context(world_directory(cwd if cwd is not None else self.scenario.cwd))
                target = ScriptRun.of(
                    self.scenario.script, plan.argv, step_clock=self.scenario.step_clock, cwd=directory
                )
            else:
                target = FunctionTarget.of(self.scenario.fn, kwargs=plan.kwargs)
            request = world.WorldRequest.of(
                target, plan.faults, spec, flight_recorder_dir=flight_recorder_dir, require_faults_fire=False
            )
            return world.run(request)


@dataclass(frozen=True)
class CaseRun:
    """A case resolved against run defaults, as a local world (:meth:`Case.run`) and a world under torchrun
    (:mod:`ddpfaults.torchrun.worker`) run it: the world's spec, its fault plan, the function's keyword arguments (a
    script's arguments), how reports name it and (under torchrun) how to replay it."""

    spec: RunSpec
    faults: tuple
    kwargs: dict
    argv: tuple = ()
    function: str = ""  # file.py:name of the rank function, or the script's path relative to the working directory
    replay: str | None = None


@dataclass(frozen=True)
class Scenario:
    """A declared scenario: the rank function (or the script) and what running it must produce."""

    fn: object  # the rank function; None for a script scenario
    name: str
    expect: Expect
    faults: tuple = ()
    settings: dict = field(default_factory=dict)  # the run settings it declares (:data:`SETTINGS`)
    kwargs: dict = field(default_factory=dict)
    variants: tuple = ()
    doc: str = ""
    script: str | None = None  # a script scenario: the script's absolute path
    argv: tuple = ()
    step_clock: str = "optimizer"
    module: str | None = None  # the declaring module (a script scenario has no function to tell it)
    cwd: str | None = None  # a script scenario's working directory (None: a fresh one per world)

    def cases(self) -> list[Case]:
        """One case per variant, or the scenario itself when it has none."""
        return [Case(self, v) for v in self.variants] or [Case(self, None)]


def scenario(*, faults=(), expect="completed", variants=(), kwargs=None, name=None, **settings):
    """Declare a module-level rank function as a scenario (see the module docstring); the keywords besides these are
    run settings (:data:`SETTINGS`)."""
    settings = _settings("scenario", settings)

    def declare(fn):
        label = _name(name, getattr(fn, "__name__", repr(fn)))
        qualname = getattr(fn, "__qualname__", "")
        if not callable(fn) or "<locals>" in qualname or "<lambda>" in qualname:
            raise ScenarioError(f"scenario {label}: must decorate a module-level function, got {fn!r}")
        declared = _declare(
            label,
            fn=fn,
            expect=expect,
            faults=faults,
            settings=settings,
            kwargs=kwargs if kwargs is not None else {},
            variants=variants,
            doc=(fn.__doc__ or "").strip().splitlines()[0] if fn.__doc__ else "",
        )
        setattr(fn, ATTRIBUTE, declared)
        return fn

    return declare


def script_scenario(
    script: str,
    *,
    argv=(),
    name=None,
    step_clock="optimizer",
    faults=(),
    expect="completed",
    variants=(),
    cwd=None,
    **settings,
) -> Scenario:
    """Declare a scenario that runs a script, unmodified, as torchrun would (see :func:`ddpfaults.run_script`);
    assign the result to a module-level name. ``script`` is relative to the declaring module's file; ``argv``
    (and each variant's ``argv``) are the script's arguments. Each world runs in a fresh, empty working directory
    (what one world leaves there never reaches the next) unless ``cwd`` names one, relative to the declaring module's
    file; the script's own folder is importable either way. The name defaults to the script's file name; the other
    keywords are run settings (:data:`SETTINGS`)."""
    settings = _settings("script_scenario", settings)
    if not isinstance(script, (str, os.PathLike)):
        raise ScenarioError(f"script_scenario: script must be a path relative to the declaring module, got {script!r}")
    script = os.fspath(script)
    declaring = sys._getframe(1).f_globals
    here = os.path.dirname(os.path.abspath(declaring.get("__file__") or "."))
    path = os.path.normpath(os.path.join(here, script))
    label = _name(name, os.path.splitext(os.path.basename(script))[0])
    if not os.path.isfile(path):
        raise ScenarioError(f"scenario {label}: script {script!r} not found (looked for {path})")
    check_step_clock(step_clock, f"scenario {label}", ScenarioError)
    if cwd is not None:
        if not isinstance(cwd, (str, os.PathLike)):
            raise ScenarioError(f"scenario {label}: cwd must be a directory's path, got {cwd!r}")
        cwd = os.path.normpath(os.path.join(here, os.fspath(cwd)))
        if not os.path.isdir(cwd):
            raise ScenarioError(f"scenario {label}: cwd {cwd!r} is not a directory (the ranks' working directory)")
    return _declare(
        label,
        fn=None,
        expect=expect,
        faults=faults,
        settings=settings,
        variants=variants,
        doc=f"runs {os.path.relpath(path, here)}",
        script=path,
        argv=_argv(argv, f"scenario {label}"),
        step_clock=step_clock,
        module=declaring.get("__name__"),
        cwd=cwd,
    )


def _name(name, default: str) -> str:
    if name is None:
        return default
    if not isinstance(name, str) or not name.strip():
        raise ScenarioError(f"scenario {default}: name must be a non-empty string, got {name!r}")
    return name


def _declare(label: str, **fields) -> Scenario:
    """The validated :class:`Scenario`; every problem a :class:`ScenarioError` naming it."""
    try:
        world_size = fields["settings"].get("world_size")
        fields["faults"] = (
            check_plan(fields["faults"]) if world_size is None else check_faults(fields["faults"], world_size)
        )
        if "kwargs" in fields:
            fields["kwargs"] = check_arguments((), fields["kwargs"])[1]
        variants = fields["variants"]
        if not isinstance(variants, (list, tuple)):
            raise ScenarioError(f"variants must be a list of ddpfaults.variant(...), got {variants!r}")
        declared = Scenario(
            name=label, **{**fields, "variants": tuple(variants), "expect": Expect.parse(fields["expect"])}
        )
        names = [getattr(v, "name", None) for v in declared.variants]
        if len(set(names)) != len(names):
            raise ScenarioError(f"variant names repeat: {names}")
        for v in declared.variants:
            if not isinstance(v, Variant):
                raise ScenarioError(f"variants must be made with ddpfaults.variant(...), got {v!r}")
        for case in declared.cases():
            _check_case(case)
    except (DDPFaultsError, TypeError) as exc:
        raise ScenarioError(f"scenario {label}: {exc}") from None
    return declared


def _check_case(case: Case) -> None:
    """What a case declares, checked without a world: its settings, its faults and expected rank against a declared
    world size, and its keyword arguments against the rank function's signature (a script takes none)."""
    where = f"variant {case.variant.name}: " if case.variant else ""
    try:
        settings = check_declared(**case.settings)
        if "world_size" in settings:
            check_faults(case.faults, settings["world_size"])
            _check_rank(case.expect, settings["world_size"])
        kwargs = {**case.scenario.kwargs, **(check_arguments((), case.variant.kwargs)[1] if case.variant else {})}
        if case.scenario.fn is not None:
            check_call(case.scenario.fn, (), kwargs)
        elif kwargs:
            raise ScenarioError(f"kwargs {kwargs!r} are for rank functions; a script takes its arguments as argv")
    except DDPFaultsError as exc:
        raise ScenarioError(f"{where}{exc}") from None


def _check_rank(expect: Expect, world_size: int) -> None:
    if expect.rank is not None and expect.rank >= world_size:
        raise ScenarioError(f"expect: rank {expect.rank} does not exist in a world of {world_size} ranks")


def scenarios_in(module) -> list[Scenario]:
    """The scenarios declared in an imported module (functions and scripts), in definition order."""
    found = [v if isinstance(v, Scenario) else getattr(v, ATTRIBUTE, None) for v in vars(module).values()]
    found = [v for v in found if isinstance(v, Scenario)]
    return [s for s in found if (s.module or getattr(s.fn, "__module__", None)) == module.__name__]


def load_function(spec: str):
    """The function ``FILE.py:NAME`` or ``MODULE:NAME`` names (a dotted NAME reaches into a class), a file imported by
    :func:`load_module`: what ``python -m ddpfaults run`` and a replay command name."""
    target, _, name = spec.rpartition(":")
    if not target or not name:
        raise DDPFaultsError(f"function {spec!r}: expected FILE.py:NAME or MODULE:NAME")
    if target.endswith(".py"):
        if not os.path.exists(target):
            raise DDPFaultsError(f"function {spec!r}: file {target!r} not found")
        module = load_module(target)
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as exc:
            raise DDPFaultsError(f"function {spec!r}: {type(exc).__name__}: {exc}") from None
    fn = module
    for part in name.split("."):
        fn = getattr(fn, part, None)
        if fn is None:
            raise DDPFaultsError(f"function {spec!r}: {module.__name__} has no attribute {name!r}")
    return fn


def load_module(path: str):
    """Import a module from its file path under its plain name (its directory goes on sys.path, as pytest's prepend
    mode does, so that ranks unpickle its functions by that name); a module already imported from that file is
    returned as it is."""
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
        raise ScenarioError(f"module {path} failed to import: {type(exc).__name__}: {exc}") from exc
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
    "Scenario",
    "ScenarioError",
    "Case",
    "Variant",
    "scenario",
    "script_scenario",
    "variant",
    "discover",
    "scenarios_in",
    "load_module",
]
