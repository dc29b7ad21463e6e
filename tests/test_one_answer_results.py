"""One answer to each question a result answers (issue 51): a world's result is frozen (nothing changes it once
built; a changed copy is a new one), and whether a rank was busy when its deadline came is one field, ``busy``, not
two flags. The runtime proof of the freeze, and a scan of the package's source for what the freeze cannot stop
(``object.__setattr__`` on another object) and for the two flags' old names."""

from __future__ import annotations

import ast
import copy
import dataclasses
import json
import pickle
import re

import pytest

from ddpfaults.judge.results import (
    Busy,
    Cause,
    Collective,
    Desync,
    Divergence,
    DivergenceGroup,
    FiredFault,
    Outcome,
    RankResult,
    RankState,
    UnfiredFault,
    WorldResult,
)
from ddpfaults.spec import RunSpec
from package_source import findings

# fixed throughout: results built by hand, their settings (stall, timeout) only data to carry; no clock runs


def _world(**fields) -> WorldResult:
    """A world with every kind of field filled: ranks (one busy), a divergence, a cause, a desync, faults."""
    call = Collective(1, "all_reduce", [[4]], "train.py:9 in step", 0, maker="ddp")
    ranks = [
        RankResult(rank=0, state=RankState.BLOCKED, collectives=[call], busy=Busy.COMPUTING, events=[{"k": "step"}]),
        RankResult(rank=1, state=RankState.RUNNING, busy=Busy.STARTING, where="importing"),
        RankResult(rank=2, state=RankState.FINISHED, value={"loss": 0.5}),
    ]
    divergence = Divergence(1, (DivergenceGroup((0,), call), DivergenceGroup((1, 2), None, "finished")), (1, 2))
    return WorldResult(
        Outcome.TIMED_OUT,
        ranks,
        "still starting at the deadline",
        None,
        "timeout",
        3.5,
        spec=RunSpec(world_size=3, seed=4, stall=2.0, timeout=60.0),
        divergence=divergence,
        faults=["RankCrash(rank=1, step=1)"],
        fired=[FiredFault(0, "RankCrash(rank=1, step=1)", 1, 1, "on_step")],
        unfired=[UnfiredFault(1, "Straggler(rank=0, step=9)", (0,))],
        cause=Cause("common_error", ranks=(0, 1, 2), error="KeyError: 'x'"),
        desync=Desync(3, 1, 2, ((0, 1), (1, 2)), "all_reduce([4])"),
        attempts=[{"outcome": "crashed"}],
        **fields,
    )


# -- WorldResult is frozen -------------------------------------------------------------------------------------------


def _refuses_every_change(result: WorldResult) -> None:
    for f in dataclasses.fields(result):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(result, f.name, getattr(result, f.name))
        with pytest.raises(dataclasses.FrozenInstanceError):
            delattr(result, f.name)
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.anything_new = 1


def test_world_result_is_a_frozen_dataclass():
    assert WorldResult.__dataclass_params__.frozen
    _refuses_every_change(_world())


@pytest.mark.parametrize(
    "copy_of",
    [
        lambda w: WorldResult.from_dict(json.loads(w.to_json())),
        lambda w: pickle.loads(pickle.dumps(w)),  # results cross processes (the plugin's workers, torchrun's store)
        copy.deepcopy,
        lambda w: dataclasses.replace(w, replay="python -m ddpfaults run t.py:f"),
    ],
    ids=["json", "pickle", "deepcopy", "replace"],
)
def test_every_way_a_result_is_copied_gives_an_equal_frozen_one(copy_of):
    world = _world(launcher="torchrun")
    copied = copy_of(world)
    _refuses_every_change(copied)
    assert copied is not world
    assert {**copied.to_dict(), "replay": None} == world.to_dict()
    assert (copied.spec, copied.launcher, copied.start_method) == (world.spec, "torchrun", "torchrun")
    assert [r.busy for r in copied.ranks] == [Busy.COMPUTING, Busy.STARTING, None]


def _frozen_bypasses(tree: ast.AST) -> list[int]:
    """Lines that set an attribute past a frozen dataclass's guard on anything but ``self``:
    ``object.__setattr__(x, ...)``, ``object.__delattr__(x, ...)``, ``x.__dict__[...] = ...`` or
    ``x.__dict__.update(...)``/``vars(x).update(...)``."""
    lines = []

    def not_self(node: ast.AST) -> bool:
        return not (isinstance(node, ast.Name) and node.id == "self")

    def namespace_of(node: ast.AST) -> ast.AST | None:
        if isinstance(node, ast.Attribute) and node.attr == "__dict__":
            return node.value
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "vars" and node.args:
            return node.args[0]
        return None

    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            call = ast.unparse(node.func)
            if call in ("object.__setattr__", "object.__delattr__") and node.args and not_self(node.args[0]):
                lines.append(node.lineno)
            elif isinstance(node.func, ast.Attribute) and node.func.attr == "update":
                owner = namespace_of(node.func.value)
                if owner is not None and not_self(owner):
                    lines.append(node.lineno)
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AugAssign) else []
        )
        for target in targets:
            if isinstance(target, ast.Subscript):
                owner = namespace_of(target.value)
                if owner is not None and not_self(owner):
                    lines.append(node.lineno)
    return sorted(lines)


def test_no_module_sets_a_frozen_object_s_attribute_from_outside():
    """What the freeze cannot stop: ``object.__setattr__`` (or the instance's ``__dict__``) on another object. Only
    a frozen class's own ``__post_init__`` sets its fields, on ``self``."""
    found = [f"{path}:{line}" for path, line in findings(_frozen_bypasses)]
    assert not found, "an object's attribute set past its frozen guard (use dataclasses.replace): " + ", ".join(found)


def test_the_bypass_finder_finds_planted_bypasses():
    planted = (
        "object.__setattr__(result, 'replay', 'x')\n"
        "object.__delattr__(result, 'replay')\n"
        "result.__dict__['outcome'] = 'hung'\n"
        "vars(result).update(outcome='hung')\n"
        "result.__dict__.update(replay=None)\n"
        "object.__setattr__(self, 'spec', spec)\n"
        "self.__dict__['x'] = 1\n"
        "init = cls.__dict__['__init__']\n"
        "options.update(x=1)\n"
    )
    assert _frozen_bypasses(ast.parse(planted)) == [1, 2, 3, 4, 5]


# -- one field for "busy when the deadline came" ---------------------------------------------------------------------


def test_a_rank_result_has_one_busy_field_and_no_flags():
    names = {f.name for f in dataclasses.fields(RankResult)}
    assert "busy" in names and not names & {"starting", "computing"}
    assert [str(b) for b in Busy] == ["starting", "computing"]
    assert RankResult(rank=0, state=RankState.RUNNING).busy is None
    with pytest.raises(TypeError):
        RankResult(rank=0, state=RankState.RUNNING, starting=True)


@pytest.mark.parametrize(
    "old, busy",
    [
        ({"starting": True, "computing": False}, Busy.STARTING),
        ({"starting": False, "computing": True}, Busy.COMPUTING),
        ({"starting": True, "computing": True}, Busy.STARTING),  # never joined: starting, whether or not it computed
        ({"starting": False, "computing": False}, None),
        ({}, None),
        ({"busy": "computing", "starting": True}, Busy.COMPUTING),  # a document's busy is its answer
        ({"busy": None}, None),
    ],
)
def test_a_document_written_with_the_two_flags_still_loads(old, busy):
    """Version 3 documents (and earlier) carry ``starting`` and ``computing``; read as ``busy``, and written back as
    ``busy`` alone."""
    loaded = RankResult.from_dict({"rank": 1, "state": "running", **old})
    assert loaded.busy is busy
    written = loaded.to_dict()
    assert written["busy"] == (None if busy is None else busy.value)
    assert not {"starting", "computing"} & set(written)
    assert json.loads(json.dumps(written))["busy"] == written["busy"]


def test_an_unknown_busy_value_is_refused_naming_it():
    with pytest.raises(ValueError, match="'sleeping' is not a valid Busy"):
        RankResult.from_dict({"rank": 0, "state": "running", "busy": "sleeping"})


FLAGS = ("starting", "computing")

#: uses of the old flags' names the scan finds that are no flags: (file, what), each with why it stays
NOT_FLAGS = {
    ("ddpfaults/judge/results.py", "data.get('starting')"): "RankResult.from_dict reads a version-3 document",
    ("ddpfaults/judge/results.py", "data.get('computing')"): "RankResult.from_dict reads a version-3 document",
}


def _flag_uses(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, what) for every use of ``starting`` or ``computing`` as a rank's flag: an attribute read or set that is
    not a method call (``r.starting``, ``r.computing = ...``; ``window.computing(live)`` is a call), a keyword
    argument (``RankResult(starting=True)``), a dict key read or set (``rank["computing"]``, ``rank.get("starting")``),
    or text naming one as an attribute (a page's script: ``rank.computing``)."""
    found = []
    called = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in FLAGS and id(node) not in called:
            found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.keyword) and node.arg in FLAGS:
            found.append((node.value.lineno, f"{node.arg}=..."))
        elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and node.slice.value in FLAGS:
            found.append((node.lineno, ast.unparse(node)))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "get"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and node.args[0].value in FLAGS
        ):
            found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            for match in re.finditer(r"\.(starting|computing)\b(?!\s*\(|`)", node.value):
                found.append((node.lineno, f"text {match.group(0)!r}"))
    return sorted(found)


def test_no_module_uses_the_two_flags():
    """Every reader and writer of "busy when the deadline came" uses ``RankResult.busy``: the judge loop sets it, the
    verdict reads it, documents carry it."""
    found = [f"  {path}:{line}: {what}" for path, (line, what) in findings(_flag_uses) if (path, what) not in NOT_FLAGS]
    assert not found, "the old flags starting/computing used (use RankResult.busy):\n" + "\n".join(found)


def test_the_flag_finder_finds_planted_uses():
    planted = (
        "if r.starting:\n"
        "    r.computing = True\n"
        "RankResult(rank=0, state=s, starting=True)\n"
        "x = rank['computing']\n"
        "y = rank.get('starting')\n"
        "js = 'if (rank.computing) { mark(rank) }'\n"
        "window.computing(live)\n"
        "observer.still_starting, observer.computing_at_deadline, r.busy\n"
        "doc = 'the window.computing(ranks) call'\n"
        "doc = 'read through :func:`activity.computing`'\n"
        "starting = under_way(observer, now)\n"
    )
    assert [line for line, _ in _flag_uses(ast.parse(planted))] == [1, 2, 3, 4, 5, 6]
