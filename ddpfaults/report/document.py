"""The session report file: one JSON document holding every world's result and timeline.

The document is ``{"schema": "ddpfaults.report/4", "worlds": [world, ...]}`` where each world is
:meth:`WorldResult.to_dict` plus an optional ``"nodeid"`` (the pytest test that ran it) and its
``"expectation"`` (:meth:`ddpfaults.expect.Expectation.to_dict`: what the world had to do and whether it
did; null for a world run without one). Every field is described in ``docs/report-schema.md``.
:func:`ddpfaults.report.html.render_html` turns a document into a page; ``python -m ddpfaults html
report.json`` does the same from the shell. :func:`timeline_calls` is what both timelines (the page's
swimlanes, the Chrome trace) draw on a rank's lane.
"""

from __future__ import annotations

import bisect
import dataclasses
import json
import os
import tempfile

from ddpfaults.errors import ReportFileError
from ddpfaults.events import MAKERS
from ddpfaults.expect import Expectation
from ddpfaults.judge.results import WorldResult

#: The schema (and version) string every report document carries; see docs/report-schema.md.
SCHEMA = "ddpfaults.report/4"
#: The schemas this version reads: its own, version 3 (a rank's ``busy`` given as two flags, ``starting`` and
#: ``computing``: ``RankResult.from_dict`` reads them) and version 2 (a version 3 one whose collectives are numbered by
#: position)
READS = ("ddpfaults.report/2", "ddpfaults.report/3", SCHEMA)


def build_document(worlds, nodeids=None, expectations=None, tests=None) -> dict:
    """The report document for ``worlds`` (WorldResult objects or their ``to_dict()`` dicts).

    ``nodeids``, if given, is a list parallel to ``worlds`` of pytest node ids (or None); a
    world whose node id is None gets no ``"nodeid"`` key. ``expectations``, likewise parallel, holds
    each world's :class:`~ddpfaults.expect.Expectation` (or its ``to_dict()``), or None for a world run
    without one; a world dict that already has an ``"expectation"`` keeps it unless one is given here. ``tests``,
    likewise parallel, holds the pytest outcome of the test that ran each world (``"passed"``, ``"failed"``,
    ``"skipped"``; None: run outside pytest), kept as its ``"test"``.
    """
    worlds = list(worlds)
    nodeids = [None] * len(worlds) if nodeids is None else list(nodeids)
    expectations = [None] * len(worlds) if expectations is None else list(expectations)
    tests = [None] * len(worlds) if tests is None else list(tests)
    for name, given in (("nodeids", nodeids), ("expectations", expectations), ("tests", tests)):
        if len(given) != len(worlds):
            raise ReportFileError(f"{name} has {len(given)} entries for {len(worlds)} worlds")
    entries = []
    for world, nodeid, expectation, test in zip(worlds, nodeids, expectations, tests, strict=True):
        entry = world.to_dict() if isinstance(world, WorldResult) else dict(world)
        if nodeid is not None:
            entry["nodeid"] = str(nodeid)
        if test is not None:
            entry["test"] = str(test)
        if expectation is not None:
            entry["expectation"] = expectation.to_dict() if isinstance(expectation, Expectation) else expectation
        entry.setdefault("expectation", None)
        entries.append(entry)
    return {"schema": SCHEMA, "worlds": entries}


def write_document(path, worlds, nodeids=None, expectations=None) -> str:
    """Write the report document for ``worlds`` (as :func:`build_document` takes them) to ``path`` atomically
    (temp file + rename); return the path.

    ``worlds`` may also be a whole document (a dict with ``"schema"``), which is written as is.
    """
    is_document = isinstance(worlds, dict) and "schema" in worlds
    document = worlds if is_document else build_document(worlds, nodeids, expectations)
    return write_json(path, document, what="report file", indent=1)


def write_json(path, document, *, what: str, **dump) -> str:
    """Write ``document`` as JSON to ``path`` atomically (temp file + rename, missing folders made); return the
    path. An OSError is a :class:`ReportFileError` naming ``what`` and the path; ``dump`` goes to json.dump."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    tmp = None
    try:
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".ddpfaults-", suffix=".json", dir=directory)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(document, f, ensure_ascii=False, **dump)
            f.write("\n")
        os.replace(tmp, path)
        tmp = None
    except OSError as exc:
        raise ReportFileError(f"{what} {path!r} cannot be written: {exc}") from None
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
    return path


def read_document(path) -> dict:
    """Load and validate a report document; raise :class:`ReportFileError` naming the file if it is not one."""
    path = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as f:
            document = json.load(f)
    except FileNotFoundError:
        raise ReportFileError(f"report file {path!r} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ReportFileError(f"report file {path!r} cannot be read: {exc}") from None
    except json.JSONDecodeError as exc:
        raise ReportFileError(f"report file {path!r} is not valid JSON: {exc}") from None
    check_document(document, source=path)
    return document


def check_document(document, *, source: str | None = None) -> None:
    """Raise :class:`ReportFileError` unless ``document`` is a report document of a schema in :data:`READS`.

    ``source`` (a file name) is named in the error; without it the error speaks of "report document".
    """
    what = f"report file {source!r}" if source else "report document"
    if not isinstance(document, dict):
        raise ReportFileError(f"{what} holds a JSON {type(document).__name__}, not a report object")
    schema = document.get("schema")
    if schema is None:
        raise ReportFileError(f'{what} has no "schema" key: not a ddpfaults report ({SCHEMA})')
    if schema not in READS:
        raise ReportFileError(
            f"{what} has schema {schema!r}; this version of ddpfaults reads {', '.join(map(repr, READS[:-1]))} and "
            f"{READS[-1]!r} only"
        )
    worlds = document.get("worlds")
    if not isinstance(worlds, list):
        raise ReportFileError(f'{what}: "worlds" must be a list, got {type(worlds).__name__}')
    for i, world in enumerate(worlds):
        if not isinstance(world, dict) or not isinstance(world.get("ranks"), list) or "outcome" not in world:
            raise ReportFileError(f'{what}: worlds[{i}] is not a world (needs "outcome" and "ranks")')
        expectation = world.get("expectation")
        if expectation is not None and (
            not isinstance(expectation, dict)
            or not isinstance(expectation.get("held"), bool)
            or not isinstance(expectation.get("mismatches"), list)
        ):
            raise ReportFileError(
                f'{what}: worlds[{i}]["expectation"] must be null or an object with "held" (true/false) and '
                f'"mismatches" (a list)'
            )


def world_status(world: dict) -> str:
    """``"failed"`` (the world's expectation did not hold, or the pytest test that ran it failed: a plain
    ``assert`` on it, as pytest counts it), ``"passed"`` (it held) or ``"unchecked"`` (the world had no expectation
    and no test that failed: its verdict alone is neither a pass nor a failure)."""
    expectation = world.get("expectation")
    if world.get("test") == "failed":
        return "failed"
    if expectation is None:
        return "unchecked"
    return "passed" if expectation.get("held") else "failed"


def _match_key(call: dict) -> tuple:
    return call.get("op"), json.dumps(call.get("shapes")), call.get("site"), call.get("step")


def collective_numbers(rank: dict) -> dict:
    """``{seq of an "enter" event: n}``: which of the rank's ``collectives`` (by its ``seq``, the numbering of every
    report) each traced call in its timeline is. The collectives may come from torch's flight recorder, which
    also holds calls the tracing never saw (DDP's own); calls are matched by op, shapes, call site and step, in
    order. An event with no match (a store wait) has no number."""
    positions: dict = {}
    for n, call in _numbered(rank):
        positions.setdefault(_match_key(call), []).append(n)
    numbers = {}
    for event in rank.get("events") or []:
        if event.get("k") == "enter" and event.get("op") != "init_process_group":
            free = positions.get(_match_key(event))
            if free:
                numbers[event.get("seq")] = free.pop(0)
    return numbers


def _numbered(rank: dict) -> list[tuple[int, dict]]:
    """The rank's ``collectives`` with their numbers (``seq``; a document without it: the position)."""
    return [(call.get("seq", n), call) for n, call in enumerate(rank.get("collectives") or [], 1)]


@dataclasses.dataclass(frozen=True)
class TimelineCall:
    """One collective (or traced wait) as the timelines draw it, from the rank's ``enter``/``exit`` events or,
    for a call only torch's flight recorder saw (DDP's own under plain DDP), from its record.

    ``t0``/``t1`` are seconds since the world's start; ``t1`` is None when the call was never left (``left``
    False) or when its end is not known (``left`` True: under gloo the flight recorder keeps only the time a
    call was issued). ``number`` is its ``seq`` among the rank's ``collectives`` (None: not one of them,
    e.g. the process-group set-up or a store wait); ``seq`` the traced call's counter (None if untraced).
    """

    op: str
    t0: float
    t1: float | None
    left: bool
    number: int | None
    seq: int | None
    source: str  # "tracing" or "flight recorder"
    shapes: list
    site: str | None
    step: int | None
    note: str
    maker: str = "user"  # who made it (ddpfaults.events.MAKERS): the page colours DDP's, FSDP's, DTensor's and DCP's

    def record(self) -> dict:
        """The call as a collective dict (``op``, ``shapes``, ``site``, ``step``, ``note``)."""
        return {"op": self.op, "shapes": self.shapes, "site": self.site, "step": self.step, "note": self.note}


def world_time(wall: float, rank: dict) -> float | None:
    """A wall-clock time (Unix seconds, the flight recorder's clock) as seconds since the world's start, by the
    rank's nearest earlier event that carries both clocks (``t`` and ``wall``); None if no event does."""
    return _world_time(wall, _clock_pairs(rank))


def _clock_pairs(rank: dict) -> list[tuple[float, float]]:
    """The rank's events that carry both clocks, as sorted (wall, t) pairs."""
    return sorted(
        (e["wall"], e["t"])
        for e in rank.get("events") or []
        if isinstance(e.get("wall"), (int, float)) and isinstance(e.get("t"), (int, float))
    )


def _world_time(wall: float, pairs: list[tuple[float, float]]) -> float | None:
    if not pairs:
        return None
    at = max(bisect.bisect_right(pairs, (wall, float("inf"))) - 1, 0)
    ref_wall, ref_t = pairs[at]
    return round(ref_t + (wall - ref_wall), 6)


def function_returned(rank: dict) -> bool:
    """True if the rank's function returned (a ``finished`` event): it left every call it made, whatever its
    flight record says (gloo may not have retired the last call in the recorder when the rank dumped it)."""
    return any(e.get("k") == "finished" for e in rank.get("events") or [])


def timeline_calls(rank: dict) -> list[TimelineCall]:
    """Every call to draw on the rank's lane, in time order, each once: the traced calls (``enter`` → ``exit``),
    then each of the rank's ``collectives`` that no traced call matched (see :func:`collective_numbers`) and
    whose issue time (``wall``) is known, placed on the world's time axis by :func:`world_time`; such a call
    was left if the recorder says it completed or the rank's function returned (``finished``)."""
    numbers = collective_numbers(rank)
    calls, traced = [], {}
    for e in sorted(rank.get("events") or [], key=lambda e: e.get("t", 0)):
        if e.get("k") == "enter" and isinstance(e.get("t"), (int, float)):
            traced[e.get("seq")] = len(calls)
            calls.append(_call(e, t0=e["t"], left=False, number=numbers.get(e.get("seq")), seq=e.get("seq")))
        elif e.get("k") == "exit" and e.get("seq") in traced:
            i = traced.pop(e["seq"])
            calls[i] = dataclasses.replace(calls[i], t1=e.get("t"), left=True)
    drawn, returned, pairs = set(numbers.values()), function_returned(rank), _clock_pairs(rank)
    for n, c in _numbered(rank):
        if n not in drawn and isinstance(c.get("wall"), (int, float)):
            t0 = _world_time(c["wall"], pairs)
            if t0 is not None:
                call = _call(c, t0=t0, left=bool(c.get("done")) or returned, number=n, source="flight recorder")
                if call.left and isinstance(c.get("wall_end"), (int, float)):
                    call = dataclasses.replace(call, t1=max(t0, _world_time(c["wall_end"], pairs)))
                calls.append(call)
    return sorted(calls, key=lambda call: call.t0)


def _call(fields: dict, *, t0: float, left: bool, number, seq=None, source="tracing") -> TimelineCall:
    return TimelineCall(
        op=str(fields.get("op")),
        t0=t0,
        t1=None,
        left=left,
        number=number,
        seq=seq,
        source=source,
        shapes=fields.get("shapes") or [],
        site=fields.get("site"),
        step=fields.get("step"),
        note=fields.get("note") or "",
        maker=fields.get("maker") or _maker_of_old_note(fields.get("note") or ""),
    )


def _maker_of_old_note(note: str) -> str:
    """The maker of a call in a document written before calls named their maker: the maker whose label of
    :data:`~ddpfaults.events.MAKERS` begins its note (such documents labelled only DDP's calls), else the user's.
    Read once here, where the old document is loaded; nothing after this reads a note as data."""
    return next((maker for maker, label in MAKERS.items() if label and note.startswith(label)), "user")
