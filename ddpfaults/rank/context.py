"""What a rank function sees: the rank context, its event log, and the collective tracing.

Tracing is installed once per rank process; the wrappers record into whichever context
is current (a warm rank runs many jobs, one context each) and fall through when none is.
"""

from __future__ import annotations

import functools
import inspect
import json
import os
import pickle
import sys
import threading
import time

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from ddpfaults.faults import Fault
from ddpfaults.faults.step import COLLECTIVE_OPS, DDP_BUCKET
from ddpfaults.rank import checkpoint, memory

#: blocking torch.distributed.Store methods traced as waits on peers (not collectives)
TRACED_STORE_WAITS = ("wait", "get")

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__))
#: frames under these directories are machinery (torch; code that runs inside a rank; faults taking effect),
#: never the call site a report should name
_MACHINERY = (
    _TORCH_DIR + os.sep,
    *(os.path.join(_PACKAGE_DIR, sub) + os.sep for sub in ("rank", "faults", "torchrun")),
)

_current: RankContext | None = None
_local = threading.local()  # .inside: a traced call is in progress on this thread (no nested records)


def is_machinery(path: str) -> bool:
    """True for files of torch and of ddpfaults' own rank machinery."""
    return path.startswith(_MACHINERY) or path.startswith("<")


class EventLog:
    """Append-only JSON-lines event file; each event is one ``os.write`` so a kill loses nothing written."""

    def __init__(self, path: str):
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)

    def emit(self, kind: str, **fields) -> dict:
        """Write one event stamped with the system-wide monotonic clock (``t``, the judge's) and the wall clock
        (``wall``: torch's flight recorder stamps collectives with it, so steps and collectives order exactly);
        return it."""
        fields["k"] = kind
        fields["t"] = time.monotonic()
        fields["wall"] = time.time()
        os.write(self._fd, (json.dumps(fields, default=str) + "\n").encode())
        return fields


#: the key torch's flight recorder gives the status of the first process group a process creates (its default group):
#: a per-process count of groups, not the group's name (a default group made again after ``destroy_process_group``
#: has the name "0" and the next count)
_FIRST_GROUP_KEY = "0"
_first_default = None  # the default group whose status is under _FIRST_GROUP_KEY (None: no group seen yet)


def default_group_seq() -> int | None:
    """How many collectives the default process group has issued so far, as torch's flight recorder numbers them
    (its entries' ``collective_seq_id``, gloo's collective tags): sends and receives are not counted, so the number
    is the same on every rank that issued the same collectives. None without a gloo default group, with the flight
    recorder off (``TORCH_FR_BUFFER_SIZE=0``), or once the default group was made again (its status is under another
    key). A step event carries it, so the judge places each recorded collective in its step by order, not by the
    recorder's approximate clock; enter, finished and failed events carry it for the judge's deadlock proof."""
    global _first_default
    try:
        if not dist.is_initialized() or dist.get_backend() != "gloo":
            return None
        if int(os.environ.get("TORCH_FR_BUFFER_SIZE", "0") or 0) <= 0:
            return None
        group = c10d._get_default_group()
        status = pickle.loads(torch._C._distributed_c10d._dump_fr_trace(False, False, False)).get("pg_status") or {}
        if _first_default is None:
            if set(status) - {_FIRST_GROUP_KEY}:
                return None  # groups were made before this one: its key is unknown
            _first_default = group
        if group is not _first_default:
            return None
        return int((status.get(_FIRST_GROUP_KEY) or {}).get("last_enqueued_collective", 0))
    except Exception:  # noqa: BLE001 - no recorder (older torch, another backend): steps fall back to wall time
        return None


def call_site() -> str:
    """``file:line in func`` of the innermost frame outside torch and ddpfaults (called from a traced wrapper)."""
    frame = sys._getframe(2)
    while frame is not None:
        path = frame.f_code.co_filename
        if not is_machinery(path):
            return f"{os.path.basename(path)}:{frame.f_lineno} in {frame.f_code.co_name}"
        frame = frame.f_back
    return "?"


def _shapes(args, kwargs) -> list:
    found = []
    for value in list(args) + list(kwargs.values()):
        if isinstance(value, torch.Tensor):
            found.append(list(value.shape))
        elif isinstance(value, (list, tuple)) and value and isinstance(value[0], torch.Tensor):
            found.append([list(t.shape) for t in value])
    return found


class RankContext:
    """What a rank function receives as its first argument.

    ``rank``, ``world_size``, ``seed``, ``shared_dir`` (a directory all ranks of this
    world share, removed afterwards), ``device`` (always CPU here), ``step(i)`` (the
    progress heartbeat and the clock faults use), ``fault(kind)`` and ``ddp(model)``.
    ``clock`` is who announces steps: None (the function calls ``step``), ``"optimizer"`` or
    ``"dataloader"`` (a script world's seams, :mod:`ddpfaults.rank.seams`).
    """

    def __init__(
        self,
        *,
        rank: int,
        world_size: int,
        seed: int,
        shared_dir: str,
        backend: str,
        peer_failure: str,
        faults: tuple,
        events: EventLog,
        clock: str | None = None,
    ):
        self.rank = rank
        self.world_size = world_size
        self.seed = seed
        self.shared_dir = shared_dir
        self.backend = backend
        self.peer_failure = peer_failure
        self.device = torch.device("cpu")
        self.faults = tuple(faults)
        self.current_step: int | None = None
        self.clock = clock
        self.batches = 0  # DataLoader batches yielded on this rank so far (the dataloader clock)
        self._events = events
        self._claimed: set[type] = set()  # fault kinds the function asked for itself (the seams leave them alone)
        self._finalize_queued = False  # a ddp_finalize announcement waits for the end of this backward pass
        self._last_bucket_launched = False  # ... and DDP launched the pass's last bucket (so it will wait for them all)
        self._fired_once: set = set()
        self._seq = 0

    # -- progress -----------------------------------------------------------------------
    def step(self, i: int) -> None:
        """Announce that this rank starts step ``i``; applies the step faults for this rank."""
        self.current_step = int(i)
        self._events.emit("step", step=self.current_step, clock=self.clock or "ctx.step", pg_seq=default_group_seq())
        memory.restore()  # an OutOfMemory limit lasts until the rank's next step
        active = self._active()
        for fault in active:
            fault.arm(self)
        for fault in active:
            if type(fault).on_step is not Fault.on_step:
                self.record_fired(fault, "on_step")
                fault.on_step(self)

    def intercept_checkpoints(self) -> None:
        """Route this process's torch.save / torch.load through the checkpoint faults (idempotent)."""
        checkpoint.install(current)

    def note_torn_collective(self, writer: int) -> None:
        """A reader entering a collective at a torn-checkpoint step tells the writer (which stops holding)."""
        checkpoint.note_collective(self, writer)

    def log(self, message: str) -> None:
        """Record a free-form message in this rank's timeline (counts as progress)."""
        self._events.emit("log", msg=str(message), step=self.current_step)

    # -- faults -------------------------------------------------------------------------
    def _active(self):
        return [f for f in self.faults if f.applies(self.rank, self.current_step)]

    def fault(self, kind: type):
        """The fault of type ``kind`` that applies to this rank at the current step, or None.

        Asking marks the fault as fired (the scenario is about to act on it), and claims ``kind`` on this
        rank: from then on torch's seams (DataLoader, DDP construction) leave faults of that kind alone.
        """
        self._claimed.add(kind)
        for fault in self._active():
            if isinstance(fault, kind):
                self.record_fired(fault, "queried")
                return fault
        return None

    def unclaimed_faults(self) -> list:
        """The faults of this world that the function has not claimed with ``ctx.fault`` (the seams' to apply)."""
        return [f for f in self.faults if not isinstance(f, tuple(self._claimed))]

    def seam_faults(self) -> list:
        """The unclaimed faults applying to this rank at the current step."""
        return [f for f in self.unclaimed_faults() if f.applies(self.rank, self.current_step)]

    def once(self, fault) -> bool:
        """True the first time it is asked for ``fault`` at the current step on this rank, then False."""
        key = (self.faults.index(fault), self.current_step)
        if key in self._fired_once:
            return False
        self._fired_once.add(key)
        return True

    def record_links_dropped(self, count: int) -> None:
        """Record that ``count`` gloo connections of this rank were shut down: its peers read end-of-file, whether the
        rank lives on or not (the judge never counts on it to keep them waiting)."""
        self._events.emit("links_dropped", count=count, step=self.current_step)

    def record_fired(self, fault, how: str) -> None:
        """Record in this rank's timeline that ``fault`` took effect (``how``: what it did)."""
        self._events.emit("fault", index=self.faults.index(fault), fault=repr(fault), how=how, step=self.current_step)

    # -- collectives ----------------------------------------------------------------------
    def _enter(self, op: str, shapes: list, site: str, note: str = "", **facts) -> int:
        """Record that this rank entered ``op``; ``facts``: what the judge's deadlock proof needs to know of the call
        (see :func:`_call_facts`)."""
        self._seq += 1
        self._events.emit(
            "enter", seq=self._seq, op=op, shapes=shapes, site=site, step=self.current_step, note=note, **facts
        )
        return self._seq

    def _exit(self, seq: int) -> None:
        self._events.emit("exit", seq=seq)

    def ddp(self, model: torch.nn.Module, **kwargs) -> torch.nn.parallel.DistributedDataParallel:
        """Wrap ``model`` in DDP with a tracing communication hook (records each gradient bucket's all_reduce).

        With ``DDPFAULTS_TRACE_DDP=0`` in the environment it is plain DDP: torch's flight recorder still sees
        every bucket, and a world is judged the same (the built-in scenarios are checked both ways).
        """
        traced = os.environ.get("DDPFAULTS_TRACE_DDP", "1").strip().lower() not in ("0", "false", "no", "off")
        _local.traced_ddp = traced
        try:
            ddp_model = torch.nn.parallel.DistributedDataParallel(model, **kwargs)
        finally:
            _local.traced_ddp = False
        if traced:
            ddp_model.register_comm_hook(None, self._comm_hook)
        return ddp_model

    def _comm_hook(self, process_group, bucket):
        skipped = skipped_bucket(self, bucket)
        if skipped is not None:
            return skipped
        entering(self, DDP_BUCKET)
        group = process_group if process_group is not None else dist.group.WORLD
        buffer = bucket.buffer()
        buffer.div_(group.size())
        facts = {"pg_seq": default_group_seq(), "async": True} if _is_default(group) else {"async": True}
        seq = self._enter(
            "all_reduce", [list(buffer.shape)], call_site(), note=f"DDP gradient bucket {bucket.index()}", **facts
        )
        original = getattr(c10d.all_reduce, "__ddpfaults_original__", c10d.all_reduce)
        future = original(buffer, group=group, async_op=True).get_future()
        self._await_buckets_after_backward(last=bucket.is_last())

        def done(fut):
            self._exit(seq)
            return fut.value()[0]

        return future.then(done)

    def _await_buckets_after_backward(self, last: bool) -> None:
        """Have the autograd engine announce (a ``ddp_finalize`` event), once this backward pass's computation is
        done, that the rank waits for its gradient buckets: a final callback queued at the pass's first bucket runs
        before DDP's own, which DDP queues once it has launched the last bucket (``last``) and which waits for every
        bucket. Without the last bucket launched DDP does not wait, and nothing is announced; where the engine takes no
        callback here, nothing is either."""
        self._last_bucket_launched = self._last_bucket_launched or last
        if self._finalize_queued:
            return

        def announce():
            launched, self._finalize_queued, self._last_bucket_launched = self._last_bucket_launched, False, False
            if launched:
                thread = (
                    {} if threading.current_thread() is threading.main_thread() else {"thread": threading.get_ident()}
                )
                self._events.emit("ddp_finalize", pg_seq=default_group_seq(), step=self.current_step, **thread)

        try:
            torch.autograd.Variable._execution_engine.queue_callback(announce)
        except RuntimeError:
            self._last_bucket_launched = False
            return
        self._finalize_queued = True


def _is_default(group) -> bool:
    """True if ``group`` (None: the default) is the default process group."""
    try:
        return group is None or group is c10d._get_default_group()
    except (RuntimeError, ValueError):  # no default group
        return False


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
    before it; only for a call on the default group), ``async`` (it returns without waiting), ``root`` (the source or
    destination rank of a rooted collective) and ``thread`` (the calling thread, when it is not the main thread)."""
    facts = {}
    if threading.current_thread() is not threading.main_thread():
        facts["thread"] = threading.get_ident()
    signature = _signature(original)
    try:
        bound = signature.bind(*args, **kwargs) if signature is not None else None
    except TypeError:
        return facts  # the call raises before making any collective
    arguments = bound.arguments if bound is not None else {}
    if arguments.get("async_op"):
        facts["async"] = True
    roots = [arguments[name] for name in _ROOTS if arguments.get(name) is not None]
    if roots and isinstance(roots[0], int):
        facts["root"] = roots[0]
    if bound is not None and _is_default(arguments.get("group")):
        facts["pg_seq"] = default_group_seq()
    return facts


def building_traced_ddp() -> bool:
    """True while ``ctx.ddp`` constructs its DDP model (it installs its own comm hook next)."""
    return getattr(_local, "traced_ddp", False)


def skipped_bucket(ctx: RankContext, bucket) -> torch.futures.Future | None:
    """When a fault skips this DDP gradient bucket's all_reduce: a done future holding the rank's own gradients."""
    for fault in ctx._active():
        if fault.skips_collective(ctx, DDP_BUCKET):
            ctx.record_fired(fault, f"skipped the all_reduce of DDP gradient bucket {bucket.index()}")
            future = torch.futures.Future()
            future.set_result(bucket.buffer())
            return future
    return None


def entering(ctx: RankContext, op: str) -> None:
    """The rank enters collective ``op`` (``"ddp_bucket"``: a DDP gradient bucket): the faults that act there."""
    for fault in ctx._active():
        done = fault.before_collective(ctx, op)
        if done is not None:
            ctx.record_fired(fault, done)


def current() -> RankContext | None:
    """The context of the job running in this rank process (None outside a job, and in the launcher)."""
    return _current


def activate(ctx: RankContext | None) -> None:
    """Make ``ctx`` the context the tracing records into (None: record nothing)."""
    global _current
    _current = ctx


def _traced_call(op: str, original, args, kwargs, *, shapes, note: str = "", skippable: bool):
    ctx = _current
    if ctx is None or getattr(_local, "inside", False):
        return original(*args, **kwargs)
    if skippable:
        for fault in ctx._active():
            if fault.skips_collective(ctx, op):
                ctx.record_fired(fault, f"skipped {op}")
                return None
        entering(ctx, op)
    facts = _call_facts(original, args, kwargs) if not op.startswith("store.") else {}
    seq = ctx._enter(op, shapes, call_site(), note=note, **facts)
    _local.inside = True
    try:
        return original(*args, **kwargs)
    finally:
        _local.inside = False
        ctx._exit(seq)


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


def install_tracing() -> None:
    """Wrap the torch.distributed collectives and blocking store reads (once per process)."""
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
