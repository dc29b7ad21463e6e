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
from ddpfaults.resolver import environment_name, first_given, from_environment, pytest_option_name
from ddpfaults.spec import (
    CLI,
    ENVIRONMENT,
    MARKER,
    PARAM,
    PARAMS,
    PYTEST,
    SCENARIO,
    TORCHRUN,
    Param,
    RunSpec,
    check_declared,
    output_problem,
    parse_bool,
    settable,
)

TEARDOWN_SLACK = 2.0  # seconds a world needs after its deadline: stack dumps, judging, killing
PYTEST_TIMEOUT_SHARE = 0.9  # a world may use this share of the time pytest-timeout leaves the item


def _parser(param: Param) -> Callable[[str], Any]:
    """The run spec's reading of ``param`` from text (ValueError, a ConfigError, on a bad value)."""
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
        return pytest_option_name(self.name)

    @property
    def ini(self) -> str:
        """The ini key, e.g. ``ddpfaults_world_size``."""
        return "ddpfaults_" + self.name

    @property
    def env(self) -> str:
        """The environment variable, e.g. ``DDPFAULTS_WORLD_SIZE``."""
        return environment_name(self.name)


def _run_option(param: Param) -> Option:
    """An option that sets a field of the run spec: its default, parser, kind and help come from the spec's table."""
    declarers = " or ".join(place for place in (SCENARIO, MARKER) if place in param.places)
    wins = f"; what a {declarers} declares wins" if declarers else ""
    if param.pins:
        wins = f"; from the command line or {param.env} it wins over markers and scenarios too, for replay"
    return Option(
        param.name,
        _parser(param),
        param.default,
        param.kind,
        f"{param.help} (default {param.text(param.default)}{wins})",
        param.metavar,
        flag=param.parse is parse_bool,  # --ddpfaults-cuda-on-cpu alone: true
    )


OPTIONS = (
    *(_run_option(param) for param in settable(PYTEST)),
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
    """The resolved settings of one pytest run: ``spec`` holds the run settings (its fields read as attributes of
    the settings too: ``settings.stall``), the rest are the plugin's own; ``sources`` says where each came from."""

    spec: RunSpec = RunSpec()
    report: str | None = None
    html: str | None = None
    trace: str | None = None
    flight_recorder: str | None = None
    scenario_files: tuple = ("scenario_*.py",)
    show: bool = False
    sources: tuple = ()

    def __getattr__(self, name: str):
        if name in PARAM:
            return getattr(self.spec, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def source(self, name: str) -> str:
        """Where ``name`` came from: its flag, its environment variable, ``ini option ...``, or ``default``."""
        return dict(self.sources).get(name, "default")

    def given(self, name: str) -> bool:
        """True if ``name`` came from the command line or the environment (not the ini file, not the default)."""
        return self.source(name).startswith(("--", "DDPFAULTS_"))

    @property
    def pinned(self) -> dict:
        """The settings whose value beats markers and scenarios (:attr:`~ddpfaults.spec.Param.pins`): given on the
        command line or in the environment."""
        return {p.name: getattr(self.spec, p.name) for p in settable(PYTEST) if p.pins and self.given(p.name)}

    @property
    def seed_pinned(self) -> bool:
        """True if the seed came from the command line or the environment: it then beats markers and scenarios."""
        return "seed" in self.pinned

    def header(self) -> str:
        """One line for pytest's report header."""
        shown = (f"{p.name}={p.text(getattr(self.spec, p.name))}{'s' if p.seconds else ''}" for p in settable(PYTEST))
        return "ddpfaults: " + " ".join(shown)


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
        where, raw = first_given(
            [
                (option.cli, config.getoption("ddpfaults_" + option.name)),
                from_environment(option.name),
                (f"ini option {option.ini}", config.getini(option.ini) or None),
            ]
        )
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
    run = {name: values.pop(name) for name in PARAM if name in values}
    if not hasattr(config, "workerinput"):  # the controller writes the reports (an xdist worker never does)
        _check_outputs(values, dict(sources), str(config.invocation_params.dir))
    try:
        spec = RunSpec(**run)
    except ConfigError:  # each value is valid (parsed above): the combination is not (stall below timeout)
        where = dict(sources)
        raise pytest.UsageError(
            f"ddpfaults: stall {run['stall']:g} s (from {where.get('stall', 'default')}) must be shorter than "
            f"timeout {run['timeout']:g} s (from {where.get('timeout', 'default')})"
        ) from None
    return Settings(spec, **values, sources=tuple(sources))


def _check_outputs(values: dict, sources: dict, here: str) -> None:
    """``pytest.UsageError`` if a report path (relative to ``here``) cannot be written, or two name one file."""
    seen: dict = {}
    for option in OPTIONS:
        value = values.get(option.name)
        if option.output is None or value is None:
            continue
        where = sources.get(option.name, "default")
        path = os.path.normpath(os.path.join(here, value))
        problem = output_problem(path, directory=option.output == "dir")
        if problem:
            raise pytest.UsageError(f"ddpfaults: {where}: {value!r} cannot be written: {problem}")
        if path in seen:
            raise pytest.UsageError(f"ddpfaults: {where} and {seen[path]} both write {value!r}: give each its own")
        seen[path] = where


# -- the ddpfaults(...) marker -------------------------------------------------------------------

#: the marker's keys, in table order, those a pinned option beats (the seed) last
MARKER_KEYS = tuple(p.name for p in sorted(settable(MARKER), key=lambda p: p.pins))
MARKER_LINE = (
    f"ddpfaults({', '.join(f'{key}=None' for key in MARKER_KEYS)}): run this test's worlds with these settings; what a "
    "scenario declares wins, "
    + ", ".join(f"{BY_NAME[p.name].cli} wins over {p.name}" for p in settable(MARKER) if p.pins)
    + "."
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
            if key == "faults":
                raise MarkerError(
                    f"{_marker(where)}: faults are not a marker setting; give them, as a list, where the world "
                    f"runs: ddp_world.run(fn, faults=[...]) or ddp_world.run_script(path, faults=[...])"
                )
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
    return spec.replace(**settings.pinned)


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


# -- the options reference (docs/options.md) ------------------------------------------------------


def reference() -> str:
    """``docs/options.md``: every run setting and where it may be set, then the plugin's own options; made from the
    run spec's table and :data:`OPTIONS` (``python -m ddpfaults.settings > docs/options.md``)."""

    def code(text: str) -> str:
        return f"`{text}`"

    def where(param: Param, place: str, text: str) -> str:
        return code(text) if place in param.places else ""

    lines = [
        "# Options",
        "",
        "Generated from `ddpfaults/spec.py` (the run settings: `RunSpec`'s fields) and `ddpfaults/settings.py` (the",
        "pytest plugin's own options) by `python -m ddpfaults.settings > docs/options.md`; `tests/test_options_doc.py`",
        "fails when this file and the code disagree.",
        "",
        "## Run settings",
        "",
        "Every setting is a keyword of `run_world`, `run_script` (all but `reuse`) and `RunSpec`; the columns say",
        "where else it may be set. A pytest option is also an ini key (`ddpfaults_NAME`) and an environment variable",
        "(`DDPFAULTS_NAME`): command line > environment > ini file > default. What a scenario or a marker declares",
        "wins over the pytest options, except a setting marked *pins* given on the command line or in the",
        "environment.",
        "",
        "| setting | default | valid values | meaning | `python -m ddpfaults run` | pytest option | marker | "
        "scenario, variant | torchrun worker | environment |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for param in PARAMS:
        pytest_option = (
            f"{code(BY_NAME[param.name].cli)}{' (pins)' if param.pins else ''}" if param.name in BY_NAME else ""
        )
        cells = [
            code(param.name),
            code(param.text(param.default)),
            param.kind,
            param.help,
            where(param, CLI, param.option),
            pytest_option,
            where(param, MARKER, f"{param.name}="),
            where(param, SCENARIO, f"{param.name}="),
            where(param, TORCHRUN, param.option),
            where(param, ENVIRONMENT, param.env),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "## The pytest plugin's own options",
        "",
        "| option | ini key | environment | default | valid values | meaning |",
        "|---|---|---|---|---|---|",
    ]
    for option in OPTIONS:
        if option.name not in PARAM:
            default = " ".join(option.default) if isinstance(option.default, tuple) else option.default
            default = "none" if default is None else str(default).lower() if isinstance(default, bool) else default
            cells = [code(option.cli), code(option.ini), code(option.env), code(default), option.kind, option.help]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(reference(), end="")
