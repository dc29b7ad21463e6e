"""The collective tracing: torch.distributed's collectives and blocking store reads wrapped, once per rank process.

The wrappers record into whichever rank context is current (a warm rank runs many jobs, one context each) and fall
through when none is; faults that skip or act at a collective act here.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import sys
import threading

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from ddpfaults import events
from ddpfaults.faults.step import COLLECTIVE_OPS
from ddpfaults.rank import effects, running, torch_private
from ddpfaults.rank.context import _is_default, _local, call_site, default_group_seq, entering, group_seq

#: blocking torch.distributed.Store methods traced as waits on peers (not collectives)
TRACED_STORE_WAITS = ("wait", "get")


def _shapes(args, kwargs) -> list:
    found = []
    for value in list(args) + list(kwargs.values()):
        if isinstance(value, torch.Tensor):
            found.append(list(value.shape))
        elif isinstance(value, (list, tuple)) and value and isinstance(value[0], torch.Tensor):
            found.append([list(t.shape) for t in value])
    return found


#: point-to-point calls that return without waiting (their Work is waited for later, or by batch_isend_irecv)
ASYNC_POINT_TO_POINT = ("isend", "irecv")
#: point-to-point calls, whose ``root`` is the peer: a send's destination, a receive's source
SENDS, RECEIVES = ("send", "isend"), ("recv", "irecv")

#: the arguments naming a rooted collective's source or destination rank
_ROOTS = ("src", "dst", "group_src", "group_dst")


@functools.cache
def _signature(original) -> inspect.Signature | None:
    try:
        return inspect.signature(original)
    except (TypeError, ValueError):
        return None


def _call_facts(original, args, kwargs) -> dict:
    """What the deadlock proof needs of a traced collective call: ``pg_seq`` (the default group's collective count
    before it), ``group_seq`` (for a call on another group, that group's), ``async`` (it returns without waiting),
    ``root`` (the global rank of a rooted collective's source or destination, a send's or receive's peer) and
    ``thread`` (the calling thread, when it is not the main thread)."""
    facts = {}
    if threading.current_thread() is not threading.main_thread():
        facts["thread"] = threading.get_ident()
    signature = _signature(original)
    try:
        bound = signature.bind(*args, **kwargs) if signature is not None else None
    except TypeError:
        return facts  # the call raises before making any collective
    arguments = bound.arguments if bound is not None else {}
    if arguments.get("async_op") or original.__name__ in ASYNC_POINT_TO_POINT:
        facts["async"] = True
    if arguments.get("input_split_sizes") is not None or arguments.get("output_split_sizes") is not None:
        try:  # all_to_all_single's rows to each rank, and from each (None: even splits)
            facts["splits"] = [
                None if arguments.get(name) is None else [int(n) for n in arguments[name]]
                for name in ("input_split_sizes", "output_split_sizes")
            ]
        except (TypeError, ValueError):
            pass
    roots = [name for name in _ROOTS if arguments.get(name) is not None]
    if roots and isinstance(arguments[roots[0]], int):
        facts["root"] = _global_rank(arguments.get("group"), arguments[roots[0]], roots[0].startswith("group_"))
    if bound is not None:
        facts["pg_seq"] = default_group_seq()
    if bound is not None and not _is_default(arguments.get("group")):
        facts.update(group_facts(arguments.get("group")))
        if "group" in facts:
            facts["group_seq"] = group_seq(arguments.get("group"))
    return facts


def _global_rank(group, rank: int, in_group: bool) -> int:
    """The global rank of a call's peer or root: ``group_dst``/``group_src`` (``in_group``) name a rank of ``group``,
    translated as torch does; ``dst``/``src`` are global already (a rank torch cannot translate is kept as given)."""
    if not in_group or _is_default(group):
        return rank
    try:
        return int(dist.get_global_rank(group, rank))
    except (ValueError, RuntimeError, TypeError, KeyError):
        return rank


def group_facts(group) -> dict:
    """``group``, ``members`` and ``desc`` (torch's ``group_desc``, for the call's note) of a call on a process
    group other than the default one: the group's identity (:func:`ddpfaults.events.group_key`: its sorted members,
    and its place among this rank's groups of the same members in the order the rank made them, as the judge reads
    a flight record's) and its member ranks; {} when torch does not know the group."""
    try:
        world = torch_private.groups()
        members = sorted(world.pg_group_ranks[group])
        same = [
            g
            for g in world.pg_names
            if g is not world.default_pg and sorted(world.pg_group_ranks.get(g, {})) == members
        ]
    except (KeyError, TypeError, AttributeError, RuntimeError):
        return {}
    ordinal = next((i for i, g in enumerate(same) if g is group), 0)
    return {"group": events.group_key(members, ordinal), "members": members, "desc": getattr(group, "group_desc", None)}


#: the rows of :data:`ddpfaults.events.MAKER_FRAMES` naming a library whose collectives are Python calls the tracing
#: sees (DDP's buckets, broadcasts and construction checks are made in C++, and reach it only through ctx.ddp's hook)
_LIBRARY_FRAMES = tuple(
    (piece.replace("/", os.sep) if piece else piece, name, maker)
    for piece, name, maker in events.MAKER_FRAMES
    if not maker.startswith("ddp")
)


def _maker(frame) -> str:
    """Who made the collective being called from ``frame`` (the first row of :data:`_LIBRARY_FRAMES` any frame of its
    stack matches), else ``"user"``."""
    stack = []
    while frame is not None:
        stack.append((frame.f_code.co_filename, frame.f_code.co_name))
        frame = frame.f_back
    for piece, name, maker in _LIBRARY_FRAMES:
        if any((piece is None or piece in path) and (name is None or name == fn) for path, fn in stack):
            return maker
    return "user"


def _traced_call(op: str, original, args, kwargs, *, shapes, note: str = "", skippable: bool):
    ctx = running.current()
    if ctx is None or getattr(_local, "inside", False):
        return original(*args, **kwargs)
    maker = "user"
    facts = _call_facts(original, args, kwargs) if not op.startswith("store.") else {}
    if skippable:
        maker = _maker(sys._getframe(2))
        # the faults that name a process group read the call's (None: the default group)
        ctx.call_group = (facts["members"], facts.get("desc")) if "members" in facts else None
        try:
            for fault in ctx._active():
                if effects.skips_collective(ctx, fault, op, maker):
                    ctx.record_fired(fault, f"skipped {op}{_by(maker)}", effect="skipped")
                    return None
            entering(ctx, op, maker)
        finally:
            ctx.call_group = None  # DDP's buckets, whose faults act in ctx.ddp's hook, are on the default group
    desc = facts.pop("desc", None)
    peer = facts.get("root")
    toward = "" if peer is None else f"to rank {peer}" if op in SENDS else f"from rank {peer}" if op in RECEIVES else ""
    note = note or "; ".join(
        n
        for n in (events.MAKERS[maker], toward, "members" in facts and events.group_label(facts["members"], desc))
        if n
    )
    return _entered(ctx, ctx._enter(op, shapes, call_site(), note=note, maker=maker, **facts), original, args, kwargs)


@contextlib.contextmanager
def untraced():
    """Nothing this thread calls inside the block is traced: ddpfaults' own calls, as the store barrier that ends a
    function world's group making (a user's would be traced)."""
    before = getattr(_local, "inside", False)
    _local.inside = True
    try:
        yield
    finally:
        _local.inside = before


def _entered(ctx, seq: int, original, args, kwargs):
    """Make the call ``original`` that ``ctx`` entered as its call ``seq``; nothing it calls in turn is traced."""
    _local.inside = True
    try:
        return original(*args, **kwargs)
    finally:
        _local.inside = False
        ctx._exit(seq)


def _by(maker: str) -> str:
    """`` (FSDP all-gather)`` for a call a library made, ``""`` for the user's."""
    return f" ({events.MAKERS[maker]})" if maker != "user" else ""


def _trace_collective(op: str, original):
    @functools.wraps(original)
    def traced(*args, **kwargs):
        return _traced_call(op, original, args, kwargs, shapes=_shapes(args, kwargs), skippable=True)

    traced.__ddpfaults_original__ = original
    return traced


def _trace_store(name: str, original):
    @functools.wraps(original)
    def traced(store, *args, **kwargs):
        keys = args[0] if args else kwargs.get("keys", kwargs.get("key"))
        return _traced_call(
            f"store.{name}", original, (store, *args), kwargs, shapes=[], note=f"keys {keys!r}"[:200], skippable=False
        )

    traced.__ddpfaults_original__ = original
    return traced


#: what a rank is in while it makes a process group (``new_group``, a DeviceMesh's dimensions): an ``enter`` event
#: with the members of the group being made, every rank's in the order it makes them (the judge compares them)
MAKING_GROUP = "new_group"


def _trace_group_making(original):
    """torch's ``_new_group_with_tag`` (which ``new_group`` and ``init_device_mesh`` call for every group, on every
    rank, member or not), recorded as a wait named :data:`MAKING_GROUP`: gloo connects a new group's members through
    the store, so a rank making another group than its peers waits there."""

    @functools.wraps(original)
    def traced(*args, **kwargs):
        ctx = running.current()
        if ctx is None or getattr(_local, "inside", False):
            return original(*args, **kwargs)
        signature = _signature(original)
        try:
            arguments = signature.bind(*args, **kwargs).arguments if signature is not None else {}
        except TypeError:
            return original(*args, **kwargs)
        ranks = arguments.get("ranks")
        members = sorted(int(r) for r in ranks) if ranks else list(range(dist.get_world_size()))
        seq = ctx._enter(MAKING_GROUP, [], call_site(), note=arguments.get("group_desc") or "", members=members)
        return _entered(ctx, seq, original, args, kwargs)

    traced.__ddpfaults_original__ = original
    return traced


def install_tracing() -> None:
    """Wrap the torch.distributed collectives, group making and blocking store reads (once per process)."""
    making = getattr(c10d, "_new_group_with_tag", None)
    if making is not None and not hasattr(making, "__ddpfaults_original__"):
        c10d._new_group_with_tag = _trace_group_making(making)
    for name in COLLECTIVE_OPS:  # wrapped on both torch.distributed and distributed_c10d
        original = getattr(c10d, name, None)
        if original is None or hasattr(original, "__ddpfaults_original__"):
            continue
        traced = _trace_collective(name, original)
        setattr(c10d, name, traced)
        if getattr(dist, name, None) is original:
            setattr(dist, name, traced)
    for name in TRACED_STORE_WAITS:
        original = getattr(dist.Store, name)
        if not hasattr(original, "__ddpfaults_original__"):
            setattr(dist.Store, name, _trace_store(name, original))


def tracing_intact() -> bool:
    """True while every traced collective is still ddpfaults' wrapper (user code may have replaced one)."""
    for name in COLLECTIVE_OPS:  # wrapped on both torch.distributed and distributed_c10d
        for module in (c10d, dist):
            value = getattr(module, name, None)
            if value is not None and not hasattr(value, "__ddpfaults_original__"):
                return False
    return True
