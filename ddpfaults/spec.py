"""The run spec: every setting a world runs with, its default, what a valid value is, validated in one place.

``run_world``, the pytest plugin (options, environment, ini, marker), the command line and the torchrun
worker all build a :class:`RunSpec`; a bad value raises one :class:`~ddpfaults.errors.ConfigError` subclass
naming the setting, the value and (when given) where it came from. What a rank function is called with
(:func:`check_call`) and where a report may be written (:func:`output_problem`) are checked here too, before any
world starts. Also here: :class:`StopReason`, why the judge stopped watching a world. Imports neither torch nor
pytest.
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ddpfaults import errors
from ddpfaults.argv import argv_text, is_argv, parse_argv
from ddpfaults.resolver import environment_name, first_given, from_environment, pytest_option_name

BACKENDS = ("gloo", "nccl")
PEER_FAILURES = ("exit", "linger")
START_METHODS = ("forkserver", "spawn", "fork")
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")
SEEDS = (-(2**63), 2**64 - 1)  # the range torch.manual_seed accepts (ValueError outside it, in every rank)


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


#: what counts a script world's steps: its optimizer's steps (the default) or the batches its DataLoader yields
STEP_CLOCKS = ("optimizer", "dataloader")


def check_step_clock(value, where: str, error: type[errors.DDPFaultsError] = errors.ConfigError) -> str:
    """``value`` if it is one of :data:`STEP_CLOCKS`, else ``error`` naming ``where`` (the call or the scenario)."""
    if value not in STEP_CLOCKS:
        raise error(f"{where}: step_clock must be one of {', '.join(STEP_CLOCKS)}, got {value!r}")
    return value


#: where a setting may be set, besides the public calls (``run_world``, ``run_script``, ``RunSpec``), which take
#: every setting: ``python -m ddpfaults run/demo`` options (``--world-size N``), the pytest plugin's options with
#: their ini keys and environment variables (``--ddpfaults-world-size``, ``ddpfaults_world_size``,
#: ``DDPFAULTS_WORLD_SIZE``), keys of the ``ddpfaults(...)`` marker, keywords of a scenario or variant declaration,
#: options of a torchrun worker (``python -m ddpfaults.launch ... --stall S``), and the environment variable
#: ``DDPFAULTS_NAME`` read by the public calls when the keyword is not given
CLI, PYTEST, MARKER, SCENARIO, TORCHRUN, ENVIRONMENT = "cli", "pytest", "marker", "scenario", "torchrun", "environment"
PLACES = (CLI, PYTEST, MARKER, SCENARIO, TORCHRUN, ENVIRONMENT)


@dataclass(frozen=True)
class Param:
    """One run setting: its default, a check of a value, how to read it from text, the error it raises, and (for a
    :class:`RunSpec` field) what it means and where it may be set (:data:`PLACES`).

    ``pins``: a value given on the command line or in the environment beats what markers and scenarios declare (the
    seed: a printed replay command reproduces the failing world). ``quiet``: replay lines leave it out at its
    default."""

    name: str
    default: Any
    kind: str  # what a valid value is, for messages and help texts
    check: Callable[[Any], bool]
    parse: Callable[[str], Any]
    error: type[errors.ConfigError] = errors.ConfigError
    choices: tuple = ()
    help: str = ""
    metavar: str = "VALUE"
    places: frozenset = frozenset()
    pins: bool = False
    quiet: bool = False  # a replay line names it only when it is not the default
    flag: str = ""  # its command-line option, when not the name's (``--restart-args`` for ``restart_argv``)

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

    @property
    def seconds(self) -> bool:
        """True for a number of seconds (shown as ``60s`` in a header, ``60`` on a command line)."""
        return self.parse is float

    def text(self, value) -> str:
        """``value`` as a command line writes it (``2`` for 2.0 seconds)."""
        if isinstance(value, (list, tuple)):
            return argv_text(value)
        return f"{value:g}" if self.seconds else str(value).lower() if isinstance(value, bool) else str(value)

    @property
    def option(self) -> str:
        """Its ``python -m ddpfaults`` and torchrun worker option, e.g. ``--world-size``."""
        return self.flag or "--" + self.name.replace("_", "-")

    @property
    def pytest_option(self) -> str:
        """Its pytest plugin option, e.g. ``--ddpfaults-world-size`` (the ini key and environment variable alike)."""
        return pytest_option_name(self.name)

    @property
    def env(self) -> str:
        """Its environment variable, e.g. ``DDPFAULTS_WORLD_SIZE``."""
        return environment_name(self.name)


def setting(default, kind: str, check, parse, error=errors.ConfigError, *, help: str, places=(), **more):
    """A :class:`RunSpec` field: its default, and its :class:`Param` (named after the field) in the field's metadata.
    ``places``: where besides the public calls it may be set (:data:`PLACES`)."""
    param = Param("", default, kind, check, parse, error, help=help, places=frozenset(places), **more)
    return dataclasses.field(default=default, metadata={"param": param})


def seconds_setting(default: float, *, help: str, places=()):
    """A :func:`setting` of seconds: a positive number, refused with :class:`~ddpfaults.errors.InvalidTimeout`."""
    return setting(
        default,
        "a positive number of seconds",
        _is_seconds,
        float,
        errors.InvalidTimeout,
        help=help,
        metavar="SECONDS",
        places=places,
    )


def _int_at_least(low: int) -> Callable[[Any], bool]:
    return lambda value: _is_int(value) and value >= low


def _check_stall(stall: float, timeout: float) -> None:
    if stall >= timeout:
        raise errors.InvalidTimeout(f"stall ({stall:g} s) must be shorter than timeout ({timeout:g} s)")


def check_declared(**values) -> dict:
    """The settings a scenario, variant or marker declares (None: not declared), each validated by its
    :class:`Param`; ``stall`` must be below ``timeout`` when both are declared. Raises the param's error."""
    checked = {name: PARAM[name].validate(value) for name, value in values.items() if value is not None}
    if "stall" in checked and "timeout" in checked:
        _check_stall(checked["stall"], checked["timeout"])
    return checked


class _Ctx:
    def __repr__(self) -> str:
        return "ctx"


def check_arguments(args=(), kwargs=None, where: str = "") -> tuple[tuple, dict]:
    """``args`` as a tuple and ``kwargs`` as a dict, or :class:`~ddpfaults.errors.InvalidArguments` (prefixed by
    ``where``) if ``args`` is not a list or tuple or ``kwargs`` (None: none) not a mapping with str keys."""
    if not isinstance(args, (list, tuple, range)):
        raise errors.InvalidArguments(f"{where}args must be a list or tuple of positional arguments, got {args!r}")
    kwargs = {} if kwargs is None else kwargs
    if not isinstance(kwargs, Mapping):
        raise errors.InvalidArguments(f"{where}kwargs must be a mapping (a dict of keyword arguments), got {kwargs!r}")
    bad = [k for k in kwargs if not isinstance(k, str)]
    if bad:
        raise errors.InvalidArguments(f"{where}kwargs keys must be argument names (str), got {bad!r}")
    return tuple(args), dict(kwargs)


def check_call(fn, args=(), kwargs=None) -> tuple[tuple, dict]:
    """``(args, kwargs)`` as a tuple and a dict, once ``fn(ctx, *args, **kwargs)`` is known to bind: ``args`` a
    sequence (not a string), ``kwargs`` a mapping with str keys, both accepted by ``fn``'s signature (a callable
    without one, such as a builtin, is accepted). :class:`~ddpfaults.errors.InvalidArguments` otherwise."""
    name = getattr(fn, "__qualname__", None) or repr(fn)
    name = f"{fn.__module__}.{name}" if isinstance(getattr(fn, "__module__", None), str) else name
    args, kwargs = check_arguments(args, kwargs, f"{name}: ")
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # no signature to check (some builtins): the call itself will tell
        return args, kwargs
    try:
        signature.bind(_Ctx(), *args, **kwargs)
    except TypeError as exc:
        given = ", ".join(["ctx", *map(repr, args), *(f"{k}={v!r}" for k, v in kwargs.items())])
        raise errors.InvalidArguments(
            f"{name}{signature} cannot be called as {name}({given}): {exc} (a rank function is called as "
            f"fn(ctx, *args, **kwargs))"
        ) from None
    return args, kwargs


def output_problem(path, *, directory: bool = False) -> str | None:
    """Why ``path`` cannot be written as a file (``directory``: used as a folder to write files in), or None.

    Missing folders on the way are no problem (every writer creates them); the nearest existing one must be a
    writable directory. The answer is what follows "cannot be written: " in a message."""
    path = os.path.abspath(os.fspath(path))
    if os.path.isdir(path):
        if not directory:
            return "it is a directory"
        return None if os.access(path, os.W_OK | os.X_OK) else "the directory is not writable"
    if os.path.lexists(path):
        if directory:
            return "it is a file, not a directory"
        if not os.access(path, os.W_OK):
            return "the file is not writable"
    parent = os.path.dirname(path)
    while not os.path.lexists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        return f"{parent} is a file, not a directory"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"the directory {parent} is not writable"
    return None


@dataclass(frozen=True)
class RunSpec:
    """How a world runs (all keyword-only, validated at construction; ``replace`` validates again). Its fields are
    the settings table: each says its default, what a valid value is, what it means and where it may be set
    (:data:`PLACES`); the options, marker keys, scenario keywords and ``docs/options.md`` are made from it.

    ``timeout`` is the hard wall-clock cap, start-up included; ``stall`` the window without progress after which
    a world whose live ranks all wait on their peers is hung (shorter than ``timeout``); ``startup`` an upper bound
    on start-up (until every rank has joined the process group), within ``timeout`` (by default the timeout bounds
    it): start-up is judged by the same evidence as the rest of a world. ``peer_failure="exit"`` lets a
    failed rank exit (gloo-native), ``"linger"`` keeps it alive with its sockets open (NCCL-like). ``reuse``
    runs on a warm world of the same shape when one is pooled.
    """

    world_size: int = setting(
        4,
        "an int >= 1",
        _int_at_least(1),
        int,
        errors.InvalidWorldSize,
        help="ranks per world",
        metavar="N",
        places=(CLI, PYTEST, MARKER, SCENARIO),
    )
    timeout: float = seconds_setting(
        300.0,
        help="hard wall-clock cap of a world in seconds, start-up included (hangs end sooner: the stall rule and the "
        "deadlock proofs; this ends a world that keeps moving, or keeps starting)",
        places=(CLI, PYTEST, MARKER, SCENARIO, TORCHRUN),
    )
    stall: float = seconds_setting(
        2.0,
        help="seconds without progress, every live rank waiting, after which a world is judged hung",
        places=(CLI, PYTEST, MARKER, SCENARIO, TORCHRUN),
    )
    startup: float = seconds_setting(
        300.0,
        help="upper bound in seconds on a world's start-up (every rank joining the process group), within the "
        "timeout: a rank still starting then (importing, computing) times the world out, one that never joined and "
        "is idle hangs it",
        places=(CLI, PYTEST, MARKER),
    )
    seed: int = setting(
        0,
        "an int from -2**63 to 2**64-1",
        lambda v: _is_int(v) and SEEDS[0] <= v <= SEEDS[1],
        int,
        help="seed of every rank's random number generators (Python's, torch's, numpy's)",
        metavar="N",
        places=(CLI, PYTEST, MARKER, TORCHRUN),
        pins=True,
    )
    backend: str = setting(
        "gloo",
        "one of " + ", ".join(BACKENDS),
        lambda v: v in BACKENDS,
        str,
        errors.UnknownBackend,
        help="gloo (CPU), or nccl: CUDA tensors on NCCL, one GPU per local rank (CPU ones on gloo); local worlds run "
        "gloo only",
        metavar="BACKEND",
        choices=BACKENDS,
        places=(TORCHRUN,),
    )
    peer_failure: str = setting(
        "exit",
        "exit or linger",
        lambda v: v in PEER_FAILURES,
        str,
        errors.UnknownPeerFailure,
        help="what a failed rank does: exit (gloo-native) or linger (NCCL-like: peers hang)",
        metavar="MODE",
        choices=PEER_FAILURES,
        places=(CLI, PYTEST, MARKER, SCENARIO),
    )
    start_method: str = setting(
        "forkserver",
        "forkserver, spawn or fork",
        lambda v: v in START_METHODS,
        str,
        errors.UnknownStartMethod,
        help="how rank processes start",
        metavar="METHOD",
        choices=START_METHODS,
        places=(CLI, PYTEST),
    )
    max_restarts: int = setting(
        0,
        "an int >= 0",
        lambda v: _is_int(v) and v >= 0,
        int,
        help="restart the whole world (new rank processes, same files) when it crashes or hangs, up to N times, as "
        "torchrun --max-restarts does; faults act in the attempt they name (attempt=0 by default)",
        metavar="N",
        places=(CLI, PYTEST, MARKER, SCENARIO),
        quiet=True,
    )
    check_resume: bool = setting(
        False,
        "true or false",
        lambda v: isinstance(v, bool),
        parse_bool,
        help="also run the world without faults and compare every optimizer step's parameters, optimizer state, "
        "learning rate and batch, and the final state, with the faulted, restarted run (docs/recovery.md)",
        metavar="BOOL",
        places=(CLI, PYTEST, MARKER, SCENARIO),
        quiet=True,
    )
    cuda_on_cpu: bool = setting(
        False,
        "true or false",
        lambda v: isinstance(v, bool),
        parse_bool,
        help="run a script written for GPUs on the CPU, unmodified: inside each rank CUDA maps to the CPU and NCCL "
        "to gloo; what has no CPU meaning (streams, CUDA graphs, custom kernels) is refused (docs/scripts.md)",
        metavar="BOOL",
        places=(CLI, PYTEST, MARKER, SCENARIO, TORCHRUN),
        quiet=True,
    )
    restart_argv: str | tuple | None = setting(
        None,
        "a shell-quoted string or a list of strings",
        is_argv,
        parse_argv,
        help="scripts: the arguments restarted attempts run with (default: the first attempt's), e.g. "
        "'--init_from=resume' for a script that resumes by a flag; {run_dir} as in the arguments (docs/recovery.md)",
        metavar="ARGS",
        places=(CLI, MARKER, SCENARIO),
        quiet=True,
        flag="--restart-args",
    )
    threads: int = setting(1, "an int >= 1", _int_at_least(1), int, help="torch threads per rank", metavar="N")
    reuse: bool = setting(
        True,
        "true or false",
        lambda v: isinstance(v, bool),
        parse_bool,
        help="run a fault-free or data-only plan on a pooled warm world of its shape, and pool this one if it stays "
        "healthy",
        metavar="BOOL",
        places=(ENVIRONMENT,),
    )

    def __post_init__(self):
        for param in PARAMS:
            object.__setattr__(self, param.name, param.validate(getattr(self, param.name)))
        _check_stall(self.stall, self.timeout)

    @property
    def startup_limit(self) -> float:
        """Seconds start-up may take before the world is stopped: ``startup``, at most ``timeout``."""
        return min(self.startup, self.timeout)

    @property
    def custom_startup(self) -> float | None:
        """``startup`` when it is not the default (a replay line names it then), else None."""
        return None if self.startup == PARAM["startup"].default else self.startup

    @classmethod
    def of(cls, spec: RunSpec | None = None, environ: Mapping[str, str] = os.environ, **given) -> RunSpec:
        """The spec a public call runs with: ``spec`` (None: the defaults) with the settings ``given`` (None: not
        given); a setting of the :data:`ENVIRONMENT` place not given is read from its ``DDPFAULTS_NAME`` in
        ``environ`` when set there. A :class:`~ddpfaults.errors.ConfigError` for a ``spec`` that is no RunSpec."""
        if spec is not None and not isinstance(spec, RunSpec):
            raise errors.ConfigError(f"spec must be a ddpfaults.RunSpec, got {spec!r}")
        for param in settable(ENVIRONMENT):
            where, raw = first_given([("keyword", given.get(param.name)), from_environment(param.name, environ)])
            if where == param.env and raw.strip():
                given[param.name] = param.from_text(raw, where)
        return (spec or cls()).replace(**given)

    def replace(self, **changes) -> RunSpec:
        """A copy with ``changes`` (None values are ignored), validated."""
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})

    def capped(self, deadline: float | None) -> RunSpec:
        """This spec with ``timeout`` shortened to ``deadline`` seconds (and ``stall`` below it), if shorter."""
        if deadline is None or self.timeout <= deadline:
            return self
        return self.replace(timeout=deadline, stall=min(self.stall, deadline / 2))


#: the settings table: every :class:`RunSpec` field's :class:`Param`, in field order
PARAMS = tuple(dataclasses.replace(f.metadata["param"], name=f.name) for f in dataclasses.fields(RunSpec))
PARAM = {p.name: p for p in PARAMS}


def settable(place: str) -> tuple[Param, ...]:
    """The settings that may be set at ``place`` (one of :data:`PLACES`), in table order."""
    return tuple(p for p in PARAMS if place in p.places)


def settings_given(call: str, given: Mapping, allowed=None) -> dict:
    """The run settings a call was given as keywords (None: not given), once each is a setting ``call`` takes
    (``allowed``: names; default every setting); a TypeError for another, as Python words it."""
    for name in given:
        if name not in (PARAM if allowed is None else allowed):
            raise TypeError(f"{call}() got an unexpected keyword argument {name!r}")
    return {name: value for name, value in given.items() if value is not None}


class StopReason(str, enum.Enum):
    """Why the judge stopped watching a world; :meth:`describe` says it in a report."""

    ENDED = "ended"
    STALL = "stall"
    PROVEN = "deadlock"
    ABANDONED = "abandoned"
    STARTUP = "startup"
    TIMEOUT = "timeout"
    TERMINATED = "terminated"

    def __str__(self) -> str:
        return self.value

    @property
    def hung(self) -> bool:
        """True if the world was stopped while ranks still ran (its outcome is hung; at the timeout, timed out
        instead if the ranks were still making progress: ``judge.verdict.world_outcome``)."""
        return self in (StopReason.STALL, StopReason.PROVEN, StopReason.STARTUP, StopReason.TIMEOUT)

    def describe(self, spec: RunSpec) -> str:
        """The reason as the report's verdict line gives it."""
        return {
            StopReason.ENDED: "every rank finished or failed",
            StopReason.STALL: f"no progress for {spec.stall:g} s and every live rank waiting on its peers",
            StopReason.PROVEN: "deadlock proved: every live rank waits in a collective, send or receive that a peer "
            "can never make",
            StopReason.ABANDONED: "a rank failed while the others still waited to join the process group, which "
            "they never can (peer_failure='exit': its process ends)",
            StopReason.STARTUP: f"start-up not finished after {spec.startup_limit:g} s (not every rank joined the "
            "process group)",
            StopReason.TIMEOUT: f"hard timeout of {spec.timeout:g} s reached",
            StopReason.TERMINATED: "torchrun's agent began stopping the ranks (a rank process exited abnormally, "
            "or torchrun was interrupted)",
        }[self]
