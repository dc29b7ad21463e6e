"""Every world's timeline as a Chrome Trace Event file, for Perfetto (ui.perfetto.dev) and chrome://tracing.

The document is the Trace Event Format's JSON object form::

    {"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {"schema": "ddpfaults.trace/1", "worlds": [...]}}

* one process per world (``pid`` = world index + 1), named by its pytest node id (or its function) and verdict;
* one thread per rank (``tid`` = rank, ``rank N``) holding its collectives as complete slices (``"ph": "X"``,
  entered → left; one never left lasts until the verdict, with ``args.left`` false) and its faults, errors,
  ``log`` lines, exit and kill as thread-scoped instants (``"ph": "i"``, ``"s": "t"``). The collectives are
  every call of the rank's record, each once: traced ones from their enter/exit events, and those only torch's
  flight recorder saw (DDP's own under plain DDP; ``args.recorder`` ``"flight recorder"``) from the time it
  stamped when the call was issued; where it recorded no end (gloo) the slice has no length
  (``args.end_recorded`` false);
* one thread per rank for its steps (``tid`` = 10000 + rank, ``rank N steps``): a slice from one ``step`` event
  to the next, the last until the rank's function ended (finished, failed, exited) or the verdict;
* collectives that overlap others only partly (DDP's gradient buckets run asynchronously) go to extra threads
  (``tid`` = 10000 * (k + 1) + rank, ``rank N async k``), so that the slices of one thread always nest;
* the world's ``stall`` and ``verdict`` events as process-scoped instants (``"s": "p"``).

Times are microseconds since the world's start (the report's ``t`` times 10^6): every world starts at 0.
The input is what :func:`ddpfaults.report.document.write_document` accepts (see ``docs/report-schema.md``).
"""

from __future__ import annotations

import os

from ddpfaults.errors import ReportFileError
from ddpfaults.judge.results import WorldResult
from ddpfaults.report.document import build_document, check_document, timeline_calls, world_status, write_json

#: The schema (and version) string in every trace's ``otherData``.
SCHEMA = "ddpfaults.trace/1"
STEPS_TID = 10000  # a rank's steps thread is STEPS_TID + rank; its k-th extra collective thread 10000 * (k + 1) + rank
_RANK_INSTANTS = ("start", "fault", "log", "failed", "finished", "exited", "killed")
_DROPPED = ("k", "t")  # event fields that become the trace event's name and ts rather than args


def trace_document(worlds, nodeids=None) -> dict:
    """The Chrome Trace Event document of ``worlds``: WorldResult objects or their ``to_dict()`` dicts (with
    ``nodeids``, a parallel list of pytest node ids or None), one WorldResult, or a whole report document."""
    if isinstance(worlds, WorldResult) or (isinstance(worlds, dict) and "ranks" in worlds):
        worlds, nodeids = [worlds], None if nodeids is None else [nodeids]
    if isinstance(worlds, dict) and "schema" in worlds:
        check_document(worlds)
        entries = worlds["worlds"]
    else:
        entries = build_document(worlds, nodeids)["worlds"]
    metadata, events, summaries = [], [], []
    for index, world in enumerate(entries):
        world_metadata, world_events = _world(index + 1, world)
        metadata += world_metadata
        events += world_events
        summaries.append(_summary(index + 1, world))
    events.sort(key=lambda e: (e["pid"], e["tid"], e["ts"], -e.get("dur", 0)))
    return {
        "traceEvents": metadata + events,
        "displayTimeUnit": "ms",
        "otherData": {"schema": SCHEMA, "worlds": summaries},
    }


def write_trace(path, worlds, nodeids=None) -> str:
    """Write the trace of ``worlds`` (as :func:`trace_document` takes them) to ``path`` atomically; return the path.

    Raises :class:`ReportFileError` naming the path if it is a directory or cannot be written.
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        raise ReportFileError(f"trace file {path!r} is a directory")
    return write_json(path, trace_document(worlds, nodeids), what="trace file", separators=(",", ":"))


# -- one world ---------------------------------------------------------------------------------------


def _us(t) -> float:
    """Seconds since the world's start → microseconds (never negative)."""
    return round(max(0.0, float(t)) * 1e6, 3)


def _timed(events) -> list[dict]:
    """The events that carry a numeric time, sorted by it (launcher-side events come late in the list)."""
    timed = [e for e in events or [] if isinstance(e, dict) and isinstance(e.get("t"), (int, float))]
    return sorted(timed, key=lambda e: e["t"])


def _args(event: dict) -> dict:
    return {k: v for k, v in event.items() if k not in _DROPPED}


def _name(world: dict) -> str:
    return world.get("nodeid") or world.get("function") or "world"


def _verdict_t(world: dict) -> float:
    """When the world was judged: its ``verdict`` event, else its elapsed time, else its last event."""
    verdicts = [e["t"] for e in _timed(world.get("events")) if e.get("k") == "verdict"]
    if verdicts:
        return verdicts[-1]
    if isinstance(world.get("elapsed"), (int, float)):
        return world["elapsed"]
    times = [e["t"] for r in world.get("ranks") or [] for e in _timed(r.get("events"))]
    return max(times, default=0.0)


def _summary(pid: int, world: dict) -> dict:
    """The world's entry in ``otherData``."""
    summary = {"pid": pid, "name": _name(world)}
    for key in ("nodeid", "function", "outcome", "root_cause", "root_rank", "reason", "seed", "world_size"):
        if key in world:
            summary[key] = world[key]
    if world.get("elapsed") is not None:
        summary["elapsed_s"] = world["elapsed"]
    if world.get("replay"):
        summary["replay"] = world["replay"]
    summary["status"] = world_status(world)
    if world.get("expectation") is not None:
        summary["expectation"] = world["expectation"]
    return summary


def _world(pid: int, world: dict) -> tuple[list[dict], list[dict]]:
    """The metadata and the events of one world (process ``pid``)."""
    outcome = world.get("outcome")
    verdict_t = _verdict_t(world)
    metadata = [
        {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": f"{_name(world)} ({outcome})"}},
        {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": pid}},
    ]
    events = []
    for e in _timed(world.get("events")):
        if e.get("k") in ("stall", "deadlock", "verdict"):
            args = _args(e)
            if e["k"] == "verdict":
                args.update(outcome=outcome, root_cause=world.get("root_cause"))
            events.append({"name": e["k"], "ph": "i", "s": "p", "ts": _us(e["t"]), "pid": pid, "tid": 0, "args": args})
    divergence = (world.get("divergence") or {}).get("index")
    for position, r in enumerate(world.get("ranks") or []):
        rank = r.get("rank", position)
        rank_metadata, rank_events = _rank(pid, rank, r, verdict_t, divergence)
        metadata += rank_metadata
        events += rank_events
    return metadata, events


def _thread(pid: int, tid: int, name: str, sort_index: int) -> list[dict]:
    return [
        {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}},
        {"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": sort_index}},
    ]


def _rank(pid: int, rank: int, r: dict, verdict_t: float, divergence) -> tuple[list[dict], list[dict]]:
    """One rank's threads: collectives and instants (tid = rank, plus extra threads for partly overlapping
    collectives), and steps (tid = STEPS_TID + rank). ``divergence``: the number of the first divergent
    collective, or None."""
    events = _timed(r.get("events"))
    slices = _collectives(r, verdict_t, divergence)
    lanes = _pack(slices)
    out = []
    for s in slices:
        lane = s.pop("lane")
        out.append({**s, "pid": pid, "tid": rank if lane == 0 else STEPS_TID * (lane + 1) + rank})
    ended = [e["t"] for e in events if e.get("k") in ("finished", "failed", "exited")]
    rank_end = min(ended) if ended else verdict_t
    steps = [e for e in events if e.get("k") == "step"]
    for i, e in enumerate(steps):
        nxt = steps[i + 1] if i + 1 < len(steps) else None
        ts = _us(e["t"])
        end = max(ts, _us(nxt["t"] if nxt is not None else rank_end))
        out.append(
            {
                "name": f"step {e.get('step')}",
                "cat": "step",
                "ph": "X",
                "ts": ts,
                "dur": round(end - ts, 3),
                "pid": pid,
                "tid": STEPS_TID + rank,
                "args": {"step": e.get("step"), "last": nxt is None},
            }
        )
    for e in events:
        if e.get("k") in _RANK_INSTANTS:
            args = _args(e)
            if e["k"] == "failed":
                args["collateral"] = bool(r.get("collateral"))
            out.append({"name": e["k"], "ph": "i", "s": "t", "ts": _us(e["t"]), "pid": pid, "tid": rank, "args": args})
    base = rank * 1000  # a rank's threads stay together, in this order: collectives, extra collectives, steps
    metadata = _thread(pid, rank, f"rank {rank}", base)
    for k in range(1, lanes):
        metadata += _thread(pid, STEPS_TID * (k + 1) + rank, f"rank {rank} async {k}", base + k)
    metadata += _thread(pid, STEPS_TID + rank, f"rank {rank} steps", base + 999)
    return metadata, out


def _collectives(r: dict, verdict_t: float, divergence) -> list[dict]:
    """One ``X`` slice per call of :func:`~ddpfaults.report.document.timeline_calls`: entered → left; never
    left: to the verdict; a flight-recorder call whose end is not recorded: a zero-length slice when issued."""
    slices = []
    for call in timeline_calls(r):
        ts = _us(call.t0)
        end = _us(call.t1) if call.t1 is not None else ts if call.left else _us(verdict_t)
        end = max(ts, end)
        args = {"seq": call.seq, "number": call.number, "shapes": call.shapes, "site": call.site}
        args.update(step=call.step, note=call.note, left=call.left, recorder=call.source)
        if call.left and call.t1 is None:
            args["end_recorded"] = False
        init = call.op == "init_process_group"
        cat = "init" if init else "collective,ddp" if call.note else "collective"
        if divergence is not None and not init and call.number == divergence:
            args["first_divergent"] = True
            cat += ",divergent"
        item = {"name": call.op or "?", "cat": cat, "ph": "X", "ts": ts, "dur": round(end - ts, 3)}
        if not call.left:
            item["cname"] = "terrible"  # chrome://tracing's reserved colour for what went wrong
        slices.append({**item, "args": args, "end": end})
    return slices


def _pack(slices: list[dict]) -> int:
    """Give each slice a lane so that the slices of one lane nest or are disjoint, never overlap in part: the
    first lane (in start order) where it fits. Sets ``lane`` (0: the rank's own thread); returns how many lanes
    were used."""
    lanes: list[list[float]] = []  # per lane, the ends of the slices still open (a stack)
    for s in sorted(slices, key=lambda s: (s["ts"], -s["end"])):
        s["lane"] = len(lanes)  # a new lane, unless one below fits
        for k, stack in enumerate(lanes):
            while stack and stack[-1] <= s["ts"]:  # slices that ended before this one starts are closed
                stack.pop()
            if not stack or s["end"] <= stack[-1]:  # disjoint from the lane's open slices, or inside the innermost
                s["lane"] = k
                break
        else:
            lanes.append([])
        lanes[s["lane"]].append(s["end"])
    for s in slices:
        del s["end"]
    return max(1, len(lanes))
