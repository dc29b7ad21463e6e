"""The pytest plugin's settings: declared once, resolved once, frozen.

Every setting is one :class:`Option` whose help text serves both ``--ddpfaults-NAME``
and the ini key ``ddpfaults_NAME``; ``DDPFAULTS_NAME`` sets it from the environment.
Resolution order: command line > environment > ini file > default. A bad value is a
``pytest.UsageError`` naming where it came from and the value.

What a scenario, a ``ddpfaults(...)`` marker or a ``ddp_world.run(...)`` call declares is
part of the test's meaning and wins over these settings, which are only defaults. The
exception is the seed: ``--ddpfaults-seed`` (or ``DDPFAULTS_SEED``) always wins, so that a
printed replay command reproduces the failing world.

This module imports neither torch nor the engine (it is loaded on every pytest start).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from .scenario import RunOptions

_RUN = RunOptions()  # the library's defaults, shared with the matrix command
PEER_FAILURES = ("exit", "linger")
START_METHODS = ("forkserver", "spawn", "fork")
TEARDOWN_SLACK = 2.0  # seconds a world needs after its deadline: stack dumps, judging, killing
PYTEST_TIMEOUT_SHARE = 0.9  # a world may use this share of the time pytest-timeout leaves the item


def _int(low: int | None):
    def parse(text: str) -> int:
        value = int(text)
        if low is not None and value < low:
            raise ValueError
        return value
    return parse


def _seconds(text: str) -> float:
    value = float(text)
    if not value > 0 or math.isinf(value):
        raise ValueError
    return value


def _choice(choices: tuple[str, ...]):
    def parse(text: str) -> str:
        if text not in choices:
            raise ValueError
        return text
    return parse


def _bool(text: str) -> bool:
    lowered = text.lower()
    if lowered not in ("1", "true", "yes", "on", "0", "false", "no", "off"):
        raise ValueError
    return lowered in ("1", "true", "yes", "on")


def _patterns(text: str) -> tuple[str, ...]:
    if not text.split():
        raise ValueError
    return tuple(text.split())


@dataclass(frozen=True)
class Option:
    """One setting: name, parser, default, what a valid value is, and the help shared by addoption and addini."""

    name: str
    parse: Callable[[str], Any]
    default: Any
    kind: str
    help: str
    metavar: str = "VALUE"
    flag: bool = False

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


_POSITIVE = "a positive number of seconds"
OPTIONS = (
    Option("world_size", _int(1), _RUN.world_size, "an int >= 1",
           "ranks per world unless a scenario or marker declares it (default 4)", "N"),
    Option("timeout", _seconds, _RUN.timeout, _POSITIVE, "hard wall-clock cap of a world in seconds (default 60)", "SECONDS"),
    Option("stall", _seconds, _RUN.stall, _POSITIVE, "seconds without progress, every live rank waiting, after which "
           "a world is judged hung (default 2)", "SECONDS"),
    Option("seed", _int(None), _RUN.seed, "an int", "seed of every world; from the command line or DDPFAULTS_SEED it "
           "overrides markers and scenarios too, for replay (default 0)", "N"),
    Option("peer_failure", _choice(PEER_FAILURES), _RUN.peer_failure, "exit or linger", "what a failed rank does unless "
           "declared: exit (gloo-native) or linger (NCCL-like: peers hang) (default exit)", "MODE"),
    Option("start_method", _choice(START_METHODS), _RUN.start_method, "forkserver, spawn or fork",
           "how rank processes start (default forkserver)", "METHOD"),
    Option("report", str, None, "a file path", "write every world's result to this JSON file", "PATH.json"),
    Option("html", str, None, "a file path", "write every world as a self-contained HTML swimlane page",
           "PATH.html"),
    Option("scenario_files", _patterns, ("scenario_*.py",), "glob patterns", "glob patterns (space separated) of "
           "scenario modules to collect (default scenario_*.py)", "GLOBS"),
    Option("show", _bool, False, "true or false", "with -v, also print the world report of passing items",
           flag=True),
)
BY_NAME = {option.name: option for option in OPTIONS}


@dataclass(frozen=True)
class Settings:
    """The resolved settings of one pytest run (``sources`` says where each value came from)."""

    world_size: int = _RUN.world_size
    timeout: float = _RUN.timeout
    stall: float = _RUN.stall
    seed: int = _RUN.seed
    peer_failure: str = _RUN.peer_failure
    start_method: str = _RUN.start_method
    report: str | None = None
    html: str | None = None
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

    def header(self) -> str:
        """One line for pytest's report header."""
        return (f"ddpfaults: world_size={self.world_size} timeout={self.timeout:g}s stall={self.stall:g}s "
                f"seed={self.seed} peer_failure={self.peer_failure} start_method={self.start_method}")


def add_options(parser: pytest.Parser) -> None:
    """Register every option in one ``ddpfaults`` group, and its ini twin, with one help text."""
    group = parser.getgroup("ddpfaults", "ddpfaults: fault-injected DDP worlds")
    for option in OPTIONS:
        dest = "ddpfaults_" + option.name
        if option.flag:
            group.addoption(option.cli, action="store_true", default=None, dest=dest, help=option.help)
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
            values[option.name] = True if raw is True else option.parse(str(raw).strip())
        except ValueError:
            raise pytest.UsageError(
                f"ddpfaults: {where}: invalid value {raw!r} (expected {option.kind})") from None
        sources.append((option.name, where))
    settings = Settings(**values, sources=tuple(sources))
    if settings.stall >= settings.timeout:
        raise pytest.UsageError(
            f"ddpfaults: stall {settings.stall:g} s (from {settings.source('stall')}) must be shorter than "
            f"timeout {settings.timeout:g} s (from {settings.source('timeout')})")
    return settings


# -- the ddpfaults(...) marker -------------------------------------------------------------------

MARKER_KEYS = ("world_size", "timeout", "stall", "peer_failure", "seed")
MARKER_LINE = (
    "ddpfaults(world_size=None, timeout=None, stall=None, peer_failure=None, seed=None): run this test's "
    "worlds with these settings; what a scenario declares wins, --ddpfaults-seed wins over seed."
)


class MarkerError(ValueError):
    """A ``ddpfaults(...)`` marker has an unknown keyword, a positional argument, or a bad value."""


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


_MARKER_CHECKS = {
    "world_size": (lambda v: _number(v) and isinstance(v, int) and v >= 1, "an int >= 1"),
    "timeout": (lambda v: _number(v) and 0 < v < math.inf, _POSITIVE),
    "stall": (lambda v: _number(v) and 0 < v < math.inf, _POSITIVE),
    "peer_failure": (lambda v: v in PEER_FAILURES, "exit or linger"),
    "seed": (lambda v: _number(v) and isinstance(v, int), "an int"),
}


def marker_values(markers) -> dict:
    """Merge ``ddpfaults`` markers, closest first (the closest wins), into checked keyword values."""
    merged: dict = {}
    for mark in markers:
        if mark.args:
            raise MarkerError(f"ddpfaults marker takes keywords only ({', '.join(MARKER_KEYS)}), "
                              f"got positional {mark.args!r}")
        for key, value in mark.kwargs.items():
            if key not in MARKER_KEYS:
                raise MarkerError(f"ddpfaults marker: unknown keyword {key!r} (known: {', '.join(MARKER_KEYS)})")
            merged.setdefault(key, value)
    for key, value in merged.items():
        valid, kind = _MARKER_CHECKS[key]
        if not valid(value):
            raise MarkerError(f"ddpfaults marker: {key}={value!r} (expected {kind})")
    return merged


# -- composing what one world runs with ----------------------------------------------------------

def run_defaults(settings: Settings, marks: dict) -> dict:
    """Defaults for a world of one test: the settings, overlaid by its marker; a pinned seed beats the marker."""
    defaults = {name: getattr(settings, name) for name in
                ("world_size", "timeout", "stall", "seed", "peer_failure", "start_method")}
    defaults.update(marks)
    if settings.seed_pinned:
        defaults["seed"] = settings.seed
    return defaults


class DeadlineError(ValueError):
    """pytest-timeout leaves a test too little time to run a world and reap it."""


def world_deadline(remaining: float | None) -> float | None:
    """The longest a world may run when pytest-timeout leaves ``remaining`` seconds to the item (None: no limit).

    The world's own deadline must fire first, with time left to dump stacks, judge and kill.
    """
    if remaining is None:
        return None
    return PYTEST_TIMEOUT_SHARE * remaining - TEARDOWN_SLACK


def cap(timeout: float, stall: float, deadline: float | None) -> tuple[float, float]:
    """``(timeout, stall)`` shortened to fit ``deadline``; stall stays below timeout."""
    if deadline is None or timeout <= deadline:
        return timeout, stall
    if deadline < 1.0:
        left = (deadline + TEARDOWN_SLACK) / PYTEST_TIMEOUT_SHARE
        raise DeadlineError(f"pytest-timeout leaves this test {left:.1f} s: too little to run a world and reap its "
                            f"ranks before pytest-timeout fires; raise the test's timeout")
    return deadline, min(stall, deadline / 2)
