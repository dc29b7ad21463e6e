"""The pytest plugin's settings: declared once, resolved once, frozen.

Every setting is one :class:`Option` whose help text serves both ``--ddpfaults-NAME``
and the ini key ``ddpfaults_NAME``; ``DDPFAULTS_NAME`` sets it from the environment.
Resolution order: command line > environment > ini file > default. A bad value is a
``pytest.UsageError`` naming where it came from and the value; so is a report path that cannot be
written (checked when pytest starts, not when the session ends).

What a scenario, a ``ddpfaults(...)`` marker or a ``ddp_world.run(...)`` call declares is
part of the test's meaning and wins over these settings, which are only defaults. The
exception is the seed: ``--ddpfaults-seed`` (or ``DDPFAULTS_SEED``) always wins, so that a
printed replay command reproduces the failing world.

This module imports neither torch nor the engine (it is loaded on every pytest start).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from ddpfaults.errors import ConfigError, DeadlineError, MarkerError
from ddpfaults.spec import PARAM, RunSpec, check_declared, output_problem, parse_bool

TEARDOWN_SLACK = 2.0  # seconds a world needs after its deadline: stack dumps, judging, killing
PYTEST_TIMEOUT_SHARE = 0.9  # a world may use this share of the time pytest-timeout leaves the item


def _param(name: str) -> Callable[[str], Any]:
    """The run spec's reading of ``name`` from text (ValueError, a ConfigError, on a bad value)."""
    param = PARAM[name]
    return lambda text: param.validate(param.parse(text))


def _patterns(text: str) -> tuple[str, ...]:
    if not text.split():
        raise ValueError
    return tuple(text.split())


@dataclass(frozen=True)
class Option:
    """One setting: name, parser, default, what a valid value is, and the help shared by addoption and addini.

    ``flag``: on the command line the option alone means true (``--ddpfaults-show``), or takes a value
    (``--ddpfaults-show=false``). ``output``: the value is a path written at the end of the session, a ``"file"``
    or a ``"dir"`` (of files), checked when the settings are resolved."""

    name: str
    parse: Callable[[str], Any]
    default: Any
    kind: str
    help: str
    metavar: str = "VALUE"
    flag: bool = False
    output: str | None = None

    @property
    def cli(self) -> str:
        """The command-line flag, e.g. ``--ddpfaults-world-size``."""
        return "--ddpfaults-" + self.name.replace("_", "-")

    @property
    def ini(self) -> str:
        """The ini key, e.g. ``ddpfaults_world_size``."""
        return "ddpfaults_" + self.name

    @property
    def env(self) -> str:
        """The environment variable, e.g. ``DDPFAULTS_WORLD_SIZE``."""
        return "DDPFAULTS_" + self.name.upper()


def _run_option(name: str, help: str, metavar: str) -> Option:
    """An option that sets a field of the run spec: its default, parser and kind come from the spec."""
    param = PARAM[name]
    return Option(
        name,
        _param(name),
        param.default,
        param.kind,
        f"{help} (default {param.default:g})"
        if isinstance(param.default, float)
        else f"{help} (default {param.default})",
        metavar,
    )


OPTIONS = (
    _run_option("world_size", "ranks per world unless a scenario or marker declares it", "N"),
    _run_option("timeout", "hard wall-clock cap of a world in seconds", "SECONDS"),
    _run_option(
        "stall", "seconds without progress, every live rank waiting, after which a world is judged hung", "SECONDS"
    ),
    _run_option(
        "startup",
        "limit in seconds on a world's start-up (every rank joining the process group), within the timeout",
        "SECONDS",
    ),
    _run_option(
        "seed",
        "seed of every world; from the command line or DDPFAULTS_SEED it overrides markers and "
        "scenarios too, for replay",
        "N",
    ),
    _run_option(
        "peer_failure",
        "what a failed rank does unless declared: exit (gloo-native) or linger (NCCL-like: peers hang)",
        "MODE",
    ),
    _run_option("start_method", "how rank processes start", "METHOD"),
    Option(
        "report", str, None, "a file path", "write every world's result to this JSON file", "PATH.json", output="file"
    ),
    Option(
        "html",
        str,
        None,
        "a file path",
        "write every world as a self-contained HTML swimlane page",
        "PATH.html",
        output="file",
    ),
    Option(
        "trace",
        str,
        None,
        "a file path",
        "write every world's timeline as a Chrome Trace Event file (Perfetto, chrome://tracing)",
        "PATH.json",
        output="file",
    ),
    Option(
        "flight_recorder",
        str,
        None,
        "a directory",
        "keep every rank's torch flight-recorder dump here, one folder per world named by its test id, in the "
        "layout python -m torch.distributed.flight_recorder.fr_trace reads",
        "DIR",
        output="dir",
    ),
    Option(
        "scenario_files",
        _patterns,
        ("scenario_*.py",),
        "glob patterns",
        "glob patterns (space separated) of scenario modules to collect (default scenario_*.py)",
        "GLOBS",
    ),
    Option(
        "show",
        parse_bool,
        False,
        "true or false",
        "with -v, also print the world report of passing items: true or false (the flag alone: true)",
        "BOOL",
        flag=True,
    ),
)
BY_NAME = {option.name: option for option in OPTIONS}


@dataclass(frozen=True)
class Settings:
    """The resolved settings of one pytest run (``sources`` says where each value came from)."""

    world_size: int = PARAM["world_size"].default
    timeout: float = PARAM["timeout"].default
    stall: float = PARAM["stall"].default
    startup: float = PARAM["startup"].default
    seed: int = PARAM["seed"].default
    peer_failure: str = PARAM["peer_failure"].default
    start_method: str = PARAM["start_method"].default
    report: str | None = None
    html: str | None = None
    trace: str | None = None
    flight_recorder: str | None = None
    scenario_files: tuple = ("scenario_*.py",)
    show: bool = False
    sources: tuple = ()

    def source(self, name: str) -> str:
        """Where ``name`` came from: its flag, its environment variable, ``ini option ...``, or ``default``."""
        return dict(self.sources).get(name, "default")

    @property
    def seed_pinned(self) -> bool:
        """True if the seed came from the command line or the environment: it then beats markers and scenarios."""
        return self.source("seed").startswith(("--", "DDPFAULTS_"))

    @property
    def spec(self) -> RunSpec:
        """These settings as the run spec of a world that declares nothing itself."""
        return RunSpec(
            world_size=self.world_size,
            timeout=self.timeout,
            stall=self.stall,
            startup=self.startup,
            seed=self.seed,
            peer_failure=self.peer_failure,
            start_method=self.start_method,
        )

    def header(self) -> str:
        """One line for pytest's report header."""
        return (
            f"ddpfaults: world_size={self.world_size} timeout={self.timeout:g}s stall={self.stall:g}s "
            f"startup={self.startup:g}s "
            f"seed={self.seed} peer_failure={self.peer_failure} start_method={self.start_method}"
        )


def add_options(parser: pytest.Parser) -> None:
    """Register every option in one ``ddpfaults`` group, and its ini twin, with one help text."""
    group = parser.getgroup("ddpfaults", "ddpfaults: fault-injected DDP worlds")
    for option in OPTIONS:
        dest = "ddpfaults_" + option.name
        if option.flag:
            group.addoption(
                option.cli, nargs="?", const="true", default=None, dest=dest, metavar=option.metavar, help=option.help
            )
        else:
            group.addoption(option.cli, default=None, dest=dest, metavar=option.metavar, help=option.help)
        parser.addini(option.ini, help=option.help, type="string", default="")


def resolve(config: pytest.Config) -> Settings:
    """Command line > environment > ini > default, parsed and checked; ``pytest.UsageError`` on a bad value."""
    values, sources = {}, []
    for option in OPTIONS:
        candidates = (
            (option.cli, config.getoption("ddpfaults_" + option.name)),
            (option.env, os.environ.get(option.env) or None),
            (f"ini option {option.ini}", config.getini(option.ini) or None),
        )
        where, raw = next(((w, v) for w, v in candidates if v is not None), ("default", None))
        if raw is None:
            values[option.name] = option.default
            continue
        try:
            values[option.name] = option.parse(str(raw).strip())
        except ValueError:
            hint = f"; the word after {option.cli} is its value" if option.flag and where == option.cli else ""
            raise pytest.UsageError(
                f"ddpfaults: {where}: invalid value {raw!r} (expected {option.kind}{hint})"
            ) from None
        sources.append((option.name, where))
    settings = Settings(**values, sources=tuple(sources))
    if not hasattr(config, "workerinput"):  # the controller writes the reports (an xdist worker never does)
        _check_outputs(settings, str(config.invocation_params.dir))
    try:
        settings.spec  # noqa: B018 - the combination must be a valid spec (stall below timeout)
    except ConfigError:
        raise pytest.UsageError(
            f"ddpfaults: stall {settings.stall:g} s (from {settings.source('stall')}) must be shorter than "
            f"timeout {settings.timeout:g} s (from {settings.source('timeout')})"
        ) from None
    return settings


def _check_outputs(settings: Settings, here: str) -> None:
    """``pytest.UsageError`` if a report path (relative to ``here``) cannot be written, or two name one file."""
    seen: dict = {}
    for option in OPTIONS:
        value = getattr(settings, option.name)
        if option.output is None or value is None:
            continue
        where = settings.source(option.name)
        path = os.path.normpath(os.path.join(here, value))
        problem = output_problem(path, directory=option.output == "dir")
        if problem:
            raise pytest.UsageError(f"ddpfaults: {where}: {value!r} cannot be written: {problem}")
        if path in seen:
            raise pytest.UsageError(f"ddpfaults: {where} and {seen[path]} both write {value!r}: give each its own")
        seen[path] = where


# -- the ddpfaults(...) marker -------------------------------------------------------------------

MARKER_KEYS = ("world_size", "timeout", "stall", "startup", "peer_failure", "seed")
MARKER_LINE = (
    "ddpfaults(world_size=None, timeout=None, stall=None, startup=None, peer_failure=None, seed=None): run this test's "
    "worlds with these settings; what a scenario declares wins, --ddpfaults-seed wins over seed."
)


def _marker(where: str) -> str:
    return f"ddpfaults marker of {where}" if where else "ddpfaults marker"


def marker_values(markers, where: str = "") -> dict:
    """Merge ``ddpfaults`` markers, closest first (the closest wins), into checked keyword values (None: not
    set); a :class:`MarkerError` naming the test ``where`` otherwise."""
    merged: dict = {}
    for mark in markers:
        if mark.args:
            raise MarkerError(
                f"{_marker(where)} takes keywords only ({', '.join(MARKER_KEYS)}), got positional {mark.args!r}"
            )
        for key, value in mark.kwargs.items():
            if key not in MARKER_KEYS:
                raise MarkerError(f"{_marker(where)}: unknown keyword {key!r} (known: {', '.join(MARKER_KEYS)})")
            merged.setdefault(key, value)
    try:
        return check_declared(**merged)
    except ConfigError as exc:
        raise MarkerError(f"{_marker(where)}: {exc}") from None


# -- composing what one world runs with ----------------------------------------------------------


def run_spec(settings: Settings, marks: dict, where: str = "") -> RunSpec:
    """The run spec of one test's worlds: the settings, overlaid by its marker; a pinned seed beats the marker.
    A marker that does not fit the settings (a timeout below the stall) is a :class:`MarkerError` naming ``where``."""
    try:
        spec = settings.spec.replace(**marks)
    except ConfigError as exc:
        sources = ", ".join(
            f"{n} from {'the marker' if n in marks else settings.source(n)}" for n in ("timeout", "stall")
        )
        raise MarkerError(f"{_marker(where)}: {exc} ({sources})") from None
    return spec.replace(seed=settings.seed) if settings.seed_pinned else spec


def fit(spec: RunSpec, remaining: float | None) -> RunSpec:
    """``spec`` with its timeout shortened so the world ends (stacks dumped, judged, killed) before pytest-timeout
    fires, ``remaining`` seconds from now (None: no pytest-timeout timer)."""
    if remaining is None:
        return spec
    deadline = PYTEST_TIMEOUT_SHARE * remaining - TEARDOWN_SLACK
    if spec.timeout <= deadline:
        return spec
    if deadline < 1.0:
        raise DeadlineError(
            f"pytest-timeout leaves this test {remaining:.1f} s: too little to run a world and reap "
            f"its ranks before pytest-timeout fires; raise the test's timeout"
        )
    return spec.capped(deadline)
