"""A rank's flight-recorder dump (torch's record of every collective it made) as the judge's collectives.

Pure functions over the unpickled dump (``version``, ``pg_config``, ``pg_status``, ``entries``); no torch.
Each entry becomes a :class:`~ddpfaults.judge.results.Collective`: its op (``gloo:all_reduce`` ->
``all_reduce``), input sizes, the call site in the user's code (the innermost frame outside torch and
ddpfaults' rank machinery), the step the rank was in when it was made (from the rank's step events), a note
naming what made it when that was not the user's own call (a DDP gradient bucket, DDP's forward broadcast,
a process group other than the default), its number (the rank's N-th collective of the job: torch's record
id where the record began empty with the job, so the number stays right when torch's ring buffer of
``TORCH_FR_BUFFER_SIZE`` entries has dropped the oldest), whether it completed (the group's ``last_completed``,
or the entry retired), when it was issued (``time_created_ns``, wall clock) and, where the backend records it
(NCCL; gloo does not), when it was seen completed (``time_discovered_completed_ns``).
"""

from __future__ import annotations

import bisect
import functools
import json
import operator
import os
import re

from ddpfaults.events import MAKER_FRAMES, MAKERS, call_site, group_key, group_label
from ddpfaults.judge.results import Collective

#: path pieces of frames that are machinery, never the call site a report should name
MACHINERY = (
    f"{os.sep}torch{os.sep}",
    f"{os.sep}ddpfaults{os.sep}rank{os.sep}",
    f"{os.sep}ddpfaults{os.sep}faults{os.sep}",
    f"{os.sep}ddpfaults{os.sep}torchrun{os.sep}",
    f"{os.sep}multiprocessing{os.sep}",
)
#: :data:`ddpfaults.events.MAKER_FRAMES` with this system's path separator
_MAKERS = tuple((piece.replace("/", os.sep) if piece else piece, name, maker) for piece, name, maker in MAKER_FRAMES)
#: where ddpfaults' own calls come from (a fault's lone barrier, say): the innermost frame outside torch and the
#: tracing wrappers is here
_OWN = (f"{os.sep}ddpfaults{os.sep}rank{os.sep}", f"{os.sep}ddpfaults{os.sep}faults{os.sep}")
#: ddpfaults' wrappers a user's own call passes through on its way to torch (the tracing; the CUDA mapping's
#: ``barrier(device_ids=…)``, ``init_process_group("nccl")``): never who made the call
_PASSED_THROUGH = tuple(
    f"{os.sep}ddpfaults{os.sep}rank{os.sep}{name}.py" for name in ("tracing", "nccl_on_gloo", "cuda_on_cpu")
)


@functools.lru_cache(maxsize=4096)
def _is_machinery(path: str) -> bool:
    """True for a frame in torch, ddpfaults' rank machinery, multiprocessing or generated code (cached: a dump
    holds the same few paths in every entry's stack)."""
    return path.startswith("<") or any(piece in path for piece in MACHINERY)


def _stack(entry: dict) -> tuple:
    """The entry's stack as ``(path, line, function)`` frames, innermost first (what :func:`_site` and
    :func:`_maker_of` read, and their cache key: a loop makes the same stack again and again)."""
    frames = entry.get("frames") or ()
    try:
        return tuple(map(_FRAME_FIELDS, frames))  # torch writes all three fields of every frame
    except KeyError:
        return tuple((f.get("filename", ""), f.get("line"), f.get("name")) for f in frames)


_FRAME_FIELDS = operator.itemgetter("filename", "line", "name")


@functools.lru_cache(maxsize=1024)
def _site(stack: tuple) -> str:
    """The call site of a record's :func:`_stack` (:func:`ddpfaults.events.call_site`: the user's line, a library
    beside)."""
    return call_site(stack, _is_machinery)


#: a frame line of a faulthandler dump (``File "x.py", line 3 in f``) or a traceback (``File "x.py", line 3, in f``)
STACK_FRAME = re.compile(r'File "([^"]+)", line (\d+),? in (\S+)')


def stack_site(stack: str | None) -> str | None:
    """The call site (as :func:`_site` names a record's) of the innermost frame outside the machinery in a
    faulthandler dump (innermost frame first), or None: where a rank that left no record was when it died."""
    for path, line, name in STACK_FRAME.findall(stack or ""):
        if not _is_machinery(path):
            return f"{os.path.basename(path)}:{line} in {name}"
    return None


def _maker(entry: dict) -> str:
    """Who made the entry's collective (a key of :data:`ddpfaults.events.MAKERS`), from the frames of its stack
    (innermost first): a library whose frame is on it, ddpfaults when the innermost frame outside torch and the
    wrappers a user's call passes through (:data:`_PASSED_THROUGH`) is its own machinery, else the user's code."""
    return _maker_of(_stack(entry))


@functools.lru_cache(maxsize=1024)
def _maker_of(stack: tuple) -> str:
    """:func:`_maker` of a :func:`_stack`."""
    for piece, name, maker in _MAKERS:
        if any((piece is None or piece in path) and (name is None or name == fn) for path, _, fn in stack):
            return maker
    innermost = next(
        (path for path, _, _ in stack if f"{os.sep}torch{os.sep}" not in path and not path.endswith(_PASSED_THROUGH)),
        "",
    )
    return "ddpfaults" if any(piece in innermost for piece in _OWN) else "user"


def group_identities(pg_config: dict | None) -> dict:
    """``{name: (key, members, desc)}`` of a dump's process groups other than the default one: each group's
    :func:`~ddpfaults.events.group_key` (its sorted members and its place among the rank's groups of the same
    members, in the order the rank made them: ``pg_config``'s), members and ``group_desc``. torch names groups by a
    per-process counter, so one group can have another name on each rank; its identity is the same on all."""
    found, made = {}, {}
    for name, config in (pg_config or {}).items():
        if str(name) == "0" or config.get("desc") == "default_pg":
            continue
        try:
            members = sorted(int(r) for r in json.loads(str(config.get("ranks", "[]"))))
        except (ValueError, TypeError):
            continue
        ordinal = made.get(tuple(members), 0)
        made[tuple(members)] = ordinal + 1
        found[str(name)] = (group_key(members, ordinal), members, config.get("desc"))
    return found


def _group(entry: dict, identities: dict) -> tuple:
    """The entry's process group: ``(key, members, desc)``, ``(None, None, None)`` for the default group; a group
    the dump does not describe is known by its name only (members None)."""
    group = entry.get("process_group") or ("0", "default_pg")
    if str(group[0]) == "0":
        return None, None, None
    return identities.get(str(group[0]), (f"name {group[0]}", None, None))


def _note(maker: str, group: tuple) -> str:
    """The label a report shows beside the call: its maker's, and its process group's when not the default."""
    notes = [MAKERS[maker]] if MAKERS[maker] else []
    key, members, desc = group
    if key is not None:
        notes.append(group_label(members, desc) if members is not None else f"process group {key}")
    return "; ".join(notes)


def op_number(entry: dict) -> int | None:
    """The entry's number in its group's count of every op it issued (``op_id``: sends and receives too), the count
    the group's ``pg_status`` (``last_enqueued_collective``, ``last_completed_collective``) and a step event's
    ``pg_seq`` keep; ``collective_seq_id`` (collectives only) where the dump has no ``op_id`` (older torch). The two
    part after the group's first send or receive (measured on gloo, torch 2.13)."""
    number = entry.get("op_id", entry.get("collective_seq_id"))
    return int(number) if number is not None else None


def _default_group_op(entry: dict) -> int | None:
    """:func:`op_number` of an entry of the default group (the count a step or batch event's ``pg_seq`` keeps), else
    None."""
    group = entry.get("process_group") or ("0", "default_pg")
    return op_number(entry) if str(group[0]) == "0" else None


def _completed(entry: dict, last_completed: int) -> bool:
    """True if the entry's collective completed. The group's ``last_completed`` is the last one to finish, not
    the highest: gloo runs a group's work on two threads, so a small all_reduce issued after a big one can finish
    first and leave ``last_completed`` behind it. Gloo retires an entry when its work finishes (``retired``);
    other backends (NCCL) also retire one that timed out, so there ``retired`` counts only with a completion."""
    if (op_number(entry) or 0) <= last_completed:
        return True
    finished = str(entry.get("profiling_name", "")).startswith("gloo:") or entry.get("time_discovered_completed_ns")
    return bool(entry.get("retired")) and bool(finished)


def _step_of(entry: dict, created: float, steps: list[tuple], times: list[float], seqs: list[int] | None) -> int | None:
    """The step the rank was in when it made ``entry``: by the default group's sequence number where its step
    events carry one (``seqs``: theirs, exact), else by time. The recorder stamps entries with torch's approximate
    clock, which can place a collective made just after a step event before it (seen: rank 0's step-1 all_reduce
    read as step 0)."""
    seq = _default_group_op(entry)
    if seq is not None and seqs:
        at = bisect.bisect_left(seqs, seq) - 1  # the last step begun before it was issued
    else:
        at = bisect.bisect_right(times, created) - 1
    return steps[at][1] if at >= 0 else None


def _batch_of(entry: dict, batches: list[tuple], seqs: list[int] | None) -> int | None:
    """The rank's last DataLoader batch drawn before it made ``entry``, by the default group's sequence number
    (``seqs``: the batch events', None when any carries none; None: no batch drawn before it, or no sequence
    numbers, or another group made it)."""
    seq = _default_group_op(entry)
    if seq is None or not seqs:
        return None
    at = bisect.bisect_left(seqs, seq) - 1
    return batches[at][0] if at >= 0 else None


def collectives(
    dump: dict, *, since_wall: float | None, steps: list[tuple], batches: list[tuple] = (), fresh: bool = False
) -> list[Collective]:
    """The collectives a rank made since ``since_wall`` (its job's start, wall-clock seconds), in order.

    ``steps`` holds ``(wall time, step)`` or ``(wall time, step, pg_seq)`` of the rank's step events, in time
    order, to give each collective the step the rank was in when it made it (``pg_seq``: how many collectives
    the default group had issued when the step began). ``batches`` holds ``(batch, pg_seq)`` of its DataLoader
    batch events, in order, to give each collective the last batch drawn before it. ``fresh``: the record began
    empty with this job (a cold rank, or a warm one that emptied it), so each collective's ``seq`` is its record id
    + 1, the job's N-th collective on the rank even when the ring buffer has dropped the oldest; else its position
    in the dump.
    """
    entries = sorted(dump.get("entries") or [], key=lambda e: e.get("record_id", 0))
    if since_wall is not None:
        entries = [e for e in entries if e.get("time_created_ns", 0) >= since_wall * 1e9]
    status = dump.get("pg_status") or {}
    times = [s[0] for s in steps]
    step_seqs = [s[2] for s in steps] if all(len(s) > 2 and s[2] is not None for s in steps) else None
    batch_seqs = [b[1] for b in batches] if all(b[1] is not None for b in batches) else None
    identities = group_identities(dump.get("pg_config"))
    found = []
    for i, entry in enumerate(entries, 1):
        created = entry.get("time_created_ns", 0) / 1e9
        completed = int((status.get(str(entry.get("pg_id"))) or {}).get("last_completed_collective", -1))
        record_id = entry.get("record_id")
        found.append(
            Collective(
                seq=record_id + 1 if fresh and isinstance(record_id, int) else i,
                op=str(entry.get("profiling_name", "?")).split(":", 1)[-1],
                shapes=[list(s) for s in entry.get("input_sizes") or []],
                site=_site(stack := _stack(entry)),
                step=_step_of(entry, created, steps, times, step_seqs),
                note=_note(maker := _maker_of(stack), group := _group(entry, identities)),
                maker=maker,
                group=group[0],
                members=group[1],
                done=_completed(entry, completed),
                wall=created,
                wall_end=completed_ns / 1e9 if (completed_ns := entry.get("time_discovered_completed_ns")) else None,
                batch=_batch_of(entry, batches, batch_seqs),
            )
        )
    return found
