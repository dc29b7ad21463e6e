"""Replay commands: the one builder of the command lines that rerun a world, printed with its report.

Four programs rerun a world: ``python -m ddpfaults run`` (a rank function or a script; what a report prints), the
pytest plugin (``pytest -p ddpfaults NODE --ddpfaults-seed=N``), a torchrun worker (``torchrun ... -m
ddpfaults.launch FILE.py::case``) and, for a plan Hypothesis drew, a Python call (``replay('f.py:fn', faults=...)``).
Each names the world its own way; the settings come from the run spec, written as the settings table says each
place spells them (:mod:`ddpfaults.spec`), in one order: counts (ranks, seed), then seconds, then words.
"""

from __future__ import annotations

import shlex
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
