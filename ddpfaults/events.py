"""The event schema: every kind of event a world's timeline holds and its fields, one encoder, one decoder.

A rank writes its events as JSON lines (a local rank to its event file, a torchrun worker through the store); the
launcher adds the ones only it can see (``exited``, ``killed``) and the judge the world's own (``stall``,
``verdict``). Every event is a plain dict: ``k`` (its kind), ``t`` (seconds: the writer's clock; the judge makes it
seconds since the world started), ``wall`` (Unix seconds, where the writer stamps it) and the fields its kind lists
in :data:`KINDS`. :func:`event` builds one (refusing an unknown kind or field), :func:`encode` and :func:`decode`
turn it into a line and back. Imports nothing of ddpfaults, nor torch: the ranks, observers, judge and reports all
use it. docs/report-schema.md describes each kind for readers of the JSON report.
"""

from __future__ import annotations

import json
import os

#: every event kind and the fields it may carry besides ``k``, ``t`` and ``wall``
KINDS: dict[str, frozenset] = {
    kind: frozenset(fields)
    for kind, fields in {
        "start": ("pid", "main_thread", "fresh_record", "pg_seq", "host", "local_rank", "output"),
        "step": ("step", "clock", "pg_seq"),
        "batch": ("index", "it", "n", "pg_seq"),
        "loader_end": ("it", "yielded"),
        "enter": (
            "seq",
            "op",
            "shapes",
            "site",
            "step",
            "note",
            "maker",
            "batch",
            "pg_seq",
            "group_seq",
            "async",
            "root",
            "thread",
            "group",
            "members",
            "splits",
        ),
        "exit": ("seq",),
        "ddp_finalize": ("pg_seq", "step", "thread"),
        "fault": ("index", "fault", "how", "step", "effect", "signal", "file"),
        "links_dropped": ("count", "step"),
        "saved": ("step", "file", "took"),
        "file": ("how", "path", "mode", "size", "src", "step"),
        "log": ("msg", "step"),
        "failed": ("error", "site", "step", "pg_seq", "names"),
        "finished": ("step", "leftovers", "pg_seq", "exits"),
        "terminated": ("signal",),
        "severed": ("sockets",),
        "exited": ("code",),
        "killed": (),
        "stall": ("window",),
        "deadlock": ("ranks",),
        "verdict": ("reason",),
    }.items()
}

#: who made a collective (a Collective's ``maker``, an ``enter`` event's): the label a report shows for it
MAKERS = {
    "user": "",
    "ddp_bucket": "DDP gradient bucket",
    "ddp_forward": "DDP forward broadcast",
    "ddp_construction": "DDP construction",
    "fsdp_all_gather": "FSDP all-gather",
    "fsdp_reduce_scatter": "FSDP reduce-scatter",
    "dtensor": "DTensor redistribute",
    "dcp": "DCP",
    "ddpfaults": "ddpfaults",
}
#: (path piece, frame function, maker): who made a collective when such a frame is on its stack (None: any path or
#: any function), first match wins: FSDP2 runs inside forward and backward too, so it is tried before DDP. The judge
#: reads it off a flight record's frames, the rank's tracing off the live stack (where a fault picks its collective).
MAKER_FRAMES = (
    ("/fsdp/", "foreach_all_gather", "fsdp_all_gather"),
    ("/fsdp/", "foreach_reduce", "fsdp_reduce_scatter"),
    ("/distributed/tensor/", "redistribute_local_tensor", "dtensor"),
    ("/distributed/checkpoint/", None, "dcp"),
    ("/nn/parallel/distributed.py", "_pre_forward", "ddp_forward"),
    (None, "_engine_run_backward", "ddp_bucket"),
    (None, "_sync_module_states", "ddp_construction"),
    (None, "_verify_param_shape_across_processes", "ddp_construction"),
)
#: makers whose calls have no call site of their own (the user's forward or backward line may differ between ranks)
SITELESS_MAKERS = frozenset({"ddp_bucket", "ddp_forward", "ddp_construction", "fsdp_all_gather", "fsdp_reduce_scatter"})

#: what a fault did when it fired (a ``fault`` event's ``effect``)
EFFECTS = frozenset(
    {
        "on_step",  # it acted as its step began (a crash, a kill, a straggler's pause, a lone barrier)
        "queried",  # the rank function asked for it (ctx.fault) and acts on it itself
        "skipped",  # a collective (or a DDP gradient bucket's all_reduce) was not made
        "at_collective",  # it acted as the rank entered a collective (a slow or dropped link)
        "changed_batch",  # a DataLoader batch was changed (emptied, a key dropped)
        "stopped_loader",  # a DataLoader iterator was cut short
        "ddp_arguments",  # DistributedDataParallel got other arguments
        "checkpoint",  # a checkpoint save or load was torn, held or killed
        "memory",  # an allocation limit took effect
        "preempted",  # a preemption notice was sent (signal None), or the grace period ran out (signal SIGKILL)
    }
)


def group_key(members, ordinal: int = 0) -> str:
    """The identity of a process group other than the default one, the same on every rank whatever order the ranks
    made their groups in (torch names a group by a per-process counter): its member ranks, sorted, and when a rank
    made more than one group of those members, the group's place among them (``"0,2"``, ``"0,2#1"``)."""
    key = ",".join(str(r) for r in sorted(members))
    return f"{key}#{ordinal}" if ordinal else key


def group_label(members, desc: str | None = None) -> str:
    """How a report names a process group: ``process group mesh_tp of ranks 0, 1`` (torch's ``group_desc`` when
    one was given)."""
    name = f" {desc}" if desc and desc not in ("undefined", "default_pg") else ""
    return f"process group{name} of ranks {', '.join(str(r) for r in sorted(members))}"


def event(kind: str, **fields) -> dict:
    """An event of ``kind`` with ``fields`` (which may include ``t`` and ``wall``); ValueError for an unknown kind,
    an unknown field or an unknown ``effect``/``maker``."""
    allowed = KINDS.get(kind)
    if allowed is None:
        raise ValueError(f"unknown event kind {kind!r}")
    unknown = set(fields) - allowed - {"t", "wall"}
    if unknown:
        raise ValueError(f"event {kind!r} has no field(s) {', '.join(sorted(unknown))}")
    if kind == "fault" and fields.get("effect") not in EFFECTS:
        raise ValueError(f"fault event: unknown effect {fields.get('effect')!r}")
    if kind == "enter" and fields.get("maker", "user") not in MAKERS:
        raise ValueError(f"enter event: unknown maker {fields.get('maker')!r}")
    return {"k": kind, **fields}


def encode(record: dict) -> str:
    """One event as a JSON line (values JSON cannot hold are written as their ``str``)."""
    return json.dumps(record, default=str) + "\n"


def decode(line: str | bytes) -> dict:
    """One JSON line back into its event."""
    return json.loads(line)


#: path pieces of installed libraries' files (accelerate's, Lightning's, transformers'): a collective one of them
#: makes is located at the user's line that called into it, the library's frame beside it
LIBRARY_PATHS = ("/site-packages/", "/dist-packages/")


def call_site(frames, is_machinery) -> str:
    """Where a collective was called, from its stack's ``frames`` (``(path, line, function)``, innermost first):
    ``file:line in func`` of the first frame outside the machinery (``is_machinery(path)``: torch, ddpfaults) and
    the installed libraries, the user's, with the innermost library frame beside it (``train.py:89 in main (via
    accelerate/utils/operations.py:355 in gather)``); the library's frame alone if no user frame called it; "?"
    with neither."""
    library = None
    for path, line, name in frames:
        if is_machinery(path):
            continue
        piece = next((p for p in LIBRARY_PATHS if p in path), None)
        if piece is None:
            where = f"{os.path.basename(path)}:{line} in {name}"
            return f"{where} (via {library})" if library else where
        if library is None:
            library = f"{path.split(piece, 1)[1]}:{line} in {name}"
    return library or "?"
