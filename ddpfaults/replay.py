"""Replay commands: the one builder of the command lines that rerun a world, printed with its report.

Four programs rerun a world: ``python -m ddpfaults run`` (a rank function or a script; what a report prints), the
pytest plugin (``pytest -p ddpfaults NODE --ddpfaults-seed=N``), a torchrun worker (``torchrun ... -m
ddpfaults.launch FILE.py::case``) and, for a plan Hypothesis drew, a Python call (``replay('f.py:fn', faults=...)``).
Each names the world its own way; the settings come from the run spec, written as the settings table says each
place spells them (:mod:`ddpfaults.spec`), in one order: counts (ranks, seed), then seconds, then words. A local
world's line is :func:`world_command` (a function's, or the script's :func:`script_command` it carries).
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ddpfaults.spec import CLI, PARAM, RunSpec, settable

#: how :func:`replay_line` writes a setting: ``--world-size 2`` (``python -m ddpfaults``, a torchrun worker),
#: ``--ddpfaults-world-size=2`` (pytest), ``world_size=2`` (a Python call)
OPTION, PYTEST_OPTION, CALL = "option", "pytest", "call"
_ORDER = (int, float, str, bool)  # counts, then seconds, then words, then (9) the rest (arguments)


def settings_of(spec: RunSpec, place: str) -> dict:
    """The settings of ``spec`` that ``place`` may set (:data:`ddpfaults.spec.PLACES`), in replay order (a quiet one
    only when it is not its default)."""
    params = sorted(settable(place), key=lambda p: _ORDER.index(type(p.default)) if type(p.default) in _ORDER else 9)
    values = {p.name: getattr(spec, p.name) for p in params}
    return {name: v for name, v in values.items() if not (PARAM[name].quiet and v == PARAM[name].default)}


def replay_line(head: Sequence[str], settings: Mapping[str, Any], tail: Sequence[str] = (), *, style=OPTION) -> str:
    """``head`` (the program and what it reruns, shell-quoted), the ``settings`` (name -> value) as ``style`` writes
    them, then ``tail``. A :data:`CALL` is ``head[0](head[1:], name=value...)`` (Python source; ``tail`` unused)."""
    if style == CALL:
        callee, *positional = head
        return f"{callee}({', '.join([*positional, *(f'{k}={v!r}' for k, v in settings.items())])})"
    words = []
    for name, value in settings.items():
        param = PARAM[name]
        if style == PYTEST_OPTION:
            words.append(f"{param.pytest_option}={shlex.quote(param.text(value))}")
        else:
            words += [param.option, shlex.quote(param.text(value))]
    return " ".join([*head, *words, *tail])


def faults_option(faults: Iterable) -> list[str]:
    """``--faults '[EmptyBatch(rank=1, step=1)]'`` for a plan (faults or their reprs); nothing for none."""
    texts = [f if isinstance(f, str) else repr(f) for f in faults]
    return ["--faults", shlex.quote("[" + ", ".join(texts) + "]")] if texts else []


def run_command(what: str, spec: RunSpec, tail: Sequence[str] = ()) -> str:
    """``python -m ddpfaults run WHAT --world-size N --seed S ...`` (``what`` shell-quoted) then ``tail``: the
    command that reruns a local world with ``spec``'s settings."""
    return replay_line(["python -m ddpfaults run", what], settings_of(spec, CLI), tail)


def world_command(world) -> str:
    """The one-line command that reruns a judged world (a :class:`~ddpfaults.judge.results.WorldResult`) with the
    same seed and faults: the line it carries (a script's, a torchrun worker's), else its function's."""
    if world.replay:
        return world.replay
    kwargs = ["--kwargs", shlex.quote(world.kwargs)] if world.kwargs else []
    return run_command(shlex.quote(world.function), world.spec, [*faults_option(world.faults), *kwargs])


def script_command(target, spec: RunSpec, faults: tuple, *, moved: bool, fresh: bool) -> str:
    """The command that reruns a script world (``target``: a :class:`~ddpfaults.rank.script.ScriptTarget`) with the
    same seed, faults and settings, in the directory it ran in: the caller's, where the command runs (``moved``
    False), the one it was given (``moved``: its absolute path, so the line runs from any directory, as a pytest
    test's temporary directory seen from elsewhere), or a fresh one of its own (``fresh``: ``--cwd "$(mktemp -d)"``)."""
    if fresh:
        where = ["--cwd", '"$(mktemp -d)"']
    elif moved and target.cwd != os.getcwd():
        where = ["--cwd", shlex.quote(os.path.abspath(target.cwd))]
    else:
        where = []
    path = target.path and (os.path.abspath(target.path) if where else os.path.relpath(target.path))
    what = f"-m {shlex.quote(target.module)}" if target.module else shlex.quote(path)
    argv = ["--", shlex.join(target.argv)] if target.argv else []
    return run_command(what, spec, [*where, "--step-clock", target.clock, *faults_option(faults), *argv])


def describe_function(fn) -> str:
    """``path/to/file.py:name`` (or ``module:name``) for reports and replay commands."""
    module = sys.modules.get(getattr(fn, "__module__", ""), None)
    path = getattr(module, "__file__", None)
    name = getattr(fn, "__qualname__", repr(fn))
    if path:
        rel = os.path.relpath(path)
        return f"{path if rel.startswith('..') else rel}:{name}"
    return f"{getattr(fn, '__module__', '?')}:{name}"
