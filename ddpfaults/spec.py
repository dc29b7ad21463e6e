"""The run spec: every setting a world runs with, its default, what a valid value is, validated in one place.

``run_world``, the pytest plugin (options, environment, ini, marker), the command line and the torchrun
worker all build a :class:`RunSpec`; a bad value raises one :class:`~ddpfaults.errors.ConfigError` subclass
naming the setting, the value and (when given) where it came from. Also here: :class:`StopReason`, why the
judge stopped watching a world. Imports neither torch nor pytest.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ddpfaults import errors

BACKENDS = ("gloo", "nccl")
PEER_FAILURES = ("exit", "linger")
START_METHODS = ("forkserver", "spawn", "fork")
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_seconds(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < math.inf


def parse_bool(text: str) -> bool:
    """``true/false``, ``1/0``, ``yes/no``, ``on/off`` (any case); ValueError otherwise."""
    lowered = text.strip().lower()
    if lowered not in _TRUE + _FALSE:
        raise ValueError(text)
    return lowered in _TRUE


@dataclass(frozen=True)
class Param:
    """One run setting: its default, a check of a value, how to read it from text, and the error it raises."""

    name: str
    default: Any
    kind: str  # what a valid value is, for messages and help texts
    check: Callable[[Any], bool]
    parse: Callable[[str], Any]
    error: type[errors.ConfigError] = errors.ConfigError
    choices: tuple = ()

    def validate(self, value, source: str | None = None):
        """``value`` if valid (ints given for seconds become floats), else the param's error naming ``source``."""
        if not self.check(value):
            where = f" (from {source})" if source else ""
            raise self.error(f"{self.name} must be {self.kind}, got {value!r}{where}")
        return float(value) if self.parse is float else value

    def from_text(self, text: str, source: str):
        """The value written as ``text`` (command line, environment, ini), validated."""
        try:
            value = self.parse(text.strip())
        except ValueError:
            raise self.error(f"{self.name} must be {self.kind}, got {text!r} (from {source})") from None
        return self.validate(value, source)


PARAMS = (
    Param("world_size", 4, "an int >= 1", lambda v: _is_int(v) and v >= 1, int, errors.InvalidWorldSize),
    Param("timeout", 60.0, "a positive number of seconds", _is_seconds, float, errors.InvalidTimeout),
    Param("stall", 2.0, "a positive number of seconds", _is_seconds, float, errors.InvalidTimeout),
    Param("startup", 30.0, "a positive number of seconds", _is_seconds, float, errors.InvalidTimeout),
    Param("seed", 0, "an int", _is_int, int),
    Param(
        "backend",
        "gloo",
        "one of " + ", ".join(BACKENDS),
        lambda v: v in BACKENDS,
        str,
        errors.UnknownBackend,
        BACKENDS,
    ),
    Param(
        "peer_failure",
        "exit",
        "exit or linger",
        lambda v: v in PEER_FAILURES,
        str,
        errors.UnknownPeerFailure,
        PEER_FAILURES,
    ),
    Param(
        "start_method",
        "forkserver",
        "forkserver, spawn or fork",
        lambda v: v in START_METHODS,
        str,
        errors.UnknownStartMethod,
        START_METHODS,
    ),
    Param("threads", 1, "an int >= 1", lambda v: _is_int(v) and v >= 1, int),
    Param("reuse", True, "true or false", lambda v: isinstance(v, bool), parse_bool),
)
PARAM = {p.name: p for p in PARAMS}


@dataclass(frozen=True)
class RunSpec:
    """How a world runs (all keyword-only, validated at construction; ``replace`` validates again).

    ``timeout`` is the hard wall-clock cap, start-up included; ``stall`` the window without progress after which
    a world whose live ranks all wait on their peers is hung (shorter than ``timeout``); ``startup`` the limit on
    start-up (until every rank has joined the process group), within ``timeout``: a world is never judged by the
    stall rule while its ranks are still joining. ``peer_failure="exit"`` lets a
    failed rank exit (gloo-native), ``"linger"`` keeps it alive with its sockets open (NCCL-like). ``reuse``
    runs on a warm world of the same shape when one is pooled.
    """

    world_size: int = PARAM["world_size"].default
    timeout: float = PARAM["timeout"].default
    stall: float = PARAM["stall"].default
    startup: float = PARAM["startup"].default
    seed: int = PARAM["seed"].default
    backend: str = PARAM["backend"].default
    peer_failure: str = PARAM["peer_failure"].default
    start_method: str = PARAM["start_method"].default
    threads: int = PARAM["threads"].default
    reuse: bool = PARAM["reuse"].default

    def __post_init__(self):
        for param in PARAMS:
            object.__setattr__(self, param.name, param.validate(getattr(self, param.name)))
        if self.stall >= self.timeout:
            raise errors.InvalidTimeout(f"stall ({self.stall:g} s) must be shorter than timeout ({self.timeout:g} s)")

    @property
    def startup_limit(self) -> float:
        """Seconds start-up may take before the world is judged hung: ``startup``, at most ``timeout``."""
        return min(self.startup, self.timeout)

    @property
    def custom_startup(self) -> float | None:
        """``startup`` when it is not the default (a replay line names it then), else None."""
        return None if self.startup == PARAM["startup"].default else self.startup

    def replace(self, **changes) -> RunSpec:
        """A copy with ``changes`` (None values are ignored), validated."""
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})

    def capped(self, deadline: float | None) -> RunSpec:
        """This spec with ``timeout`` shortened to ``deadline`` seconds (and ``stall`` below it), if shorter."""
        if deadline is None or self.timeout <= deadline:
            return self
        return self.replace(timeout=deadline, stall=min(self.stall, deadline / 2))


class StopReason(str, enum.Enum):
    """Why the judge stopped watching a world; :meth:`describe` says it in a report."""

    ENDED = "ended"
    STALL = "stall"
    STARTUP = "startup"
    TIMEOUT = "timeout"
    TERMINATED = "terminated"

    def __str__(self) -> str:
        return self.value

    @property
    def hung(self) -> bool:
        """True if the world was stopped while ranks still ran (its outcome is hung)."""
        return self in (StopReason.STALL, StopReason.STARTUP, StopReason.TIMEOUT)

    def describe(self, spec: RunSpec) -> str:
        """The reason as the report's verdict line gives it."""
        return {
            StopReason.ENDED: "every rank finished or failed",
            StopReason.STALL: f"no progress for {spec.stall:g} s and every live rank waiting on its peers",
            StopReason.STARTUP: f"start-up not finished after {spec.startup_limit:g} s (not every rank joined the "
            "process group)",
            StopReason.TIMEOUT: f"hard timeout of {spec.timeout:g} s reached",
            StopReason.TERMINATED: "torchrun's agent began stopping the ranks (a rank process exited abnormally, "
            "or torchrun was interrupted)",
        }[self]
