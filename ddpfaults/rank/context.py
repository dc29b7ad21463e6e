"""What a rank function sees: the rank context and its event log (the collective tracing that records into the
current context is :mod:`ddpfaults.rank.tracing`)."""

from __future__ import annotations

import os
import sys
import threading
import time

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from ddpfaults import events
from ddpfaults.faults.step import DDP_BUCKET
from ddpfaults.rank import effects, torch_private
from ddpfaults.spec import RunSpec

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__))
#: frames under these directories are machinery (torch; code that runs inside a rank; faults taking effect),
#: never the call site a report should name
_MACHINERY = (
    _TORCH_DIR + os.sep,
    *(os.path.join(_PACKAGE_DIR, sub) + os.sep for sub in ("rank", "faults", "torchrun")),
)

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
        record = events.event(kind, t=time.monotonic(), wall=time.time(), **fields)
        os.write(self._fd, events.encode(record).encode())
        return record


#: the key torch's flight recorder gives the status of the first process group a process creates (its default group):
#: a per-process count of groups, not the group's name (a default group made again after ``destroy_process_group``
#: has the name "0" and the next count)
_FIRST_GROUP_KEY = "0"
_first_default = None  # the default group whose status is under _FIRST_GROUP_KEY (None: no group seen yet)


def default_group_seq() -> int | None:
    """How many ops the default process group has issued so far, as torch's flight recorder numbers them (its
    entries' ``op_id``, :func:`ddpfaults.judge.flight.op_number`): sends and receives count too (gloo, torch 2.13:
    an all_reduce, two sends, an all_reduce end at 4), so ranks that made different numbers of sends and receives
    number one collective differently. None without a gloo default group, with the flight
    recorder off (``TORCH_FR_BUFFER_SIZE=0``), or once the default group was made again (its status is under another
    key). A step event carries it, so the judge places each recorded collective in its step by order, not by the
    recorder's approximate clock; enter, finished and failed events carry it for the judge's deadlock proof."""
    global _first_default
    try:
        if not dist.is_initialized() or dist.get_backend() != "gloo":
            return None
        if int(os.environ.get("TORCH_FR_BUFFER_SIZE", "0") or 0) <= 0:
            return None
        group = torch_private.default_group()
        status = torch_private.flight_record(collectives=False, stacks=False).get("pg_status") or {}
        if _first_default is None:
            if set(status) - {_FIRST_GROUP_KEY}:
                return None  # groups were made before this one: its key is unknown
            _first_default = group
        if group is not _first_default:
            return None
        return int((status.get(_FIRST_GROUP_KEY) or {}).get("last_enqueued_collective", 0))
    except Exception:  # noqa: BLE001 - no recorder (older torch, another backend): steps fall back to wall time
        return None


def group_seq(group) -> int | None:
    """How many collectives process group ``group`` (one other than the default) has issued so far, as torch's
    flight recorder numbers them (its status is under the group's place among this process's groups, the default
    group's first: the recorder counts the groups a process makes); None with the recorder off, or where the count
    cannot be read. A guess for the judge's deadlock proof, which confirms it against the rank's flight record (a
    group made after another was destroyed shifts the recorder's count)."""
    try:
        if int(os.environ.get("TORCH_FR_BUFFER_SIZE", "0") or 0) <= 0 or _first_default is None:
            return None
        made = list(torch_private.groups().pg_names)
        if not made or made[0] is not _first_default:
            return None
        status = torch_private.flight_record(collectives=False, stacks=False).get("pg_status") or {}
        return int((status.get(str(made.index(group))) or {}).get("last_enqueued_collective", 0))
    except Exception:  # noqa: BLE001 - no recorder, or a group torch does not know: no count to prove from
        return None


def call_site() -> str:
    """``file:line in func`` of the user's frame that made the call, with a library's beside it
    (:func:`ddpfaults.events.call_site`; called from a traced wrapper)."""
    frames, frame = [], sys._getframe(2)
    while frame is not None:
        frames.append((frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name))
        frame = frame.f_back
    return events.call_site(frames, is_machinery)


class RankContext:
    """What a rank function receives as its first argument.

    ``rank``, ``world_size``, ``seed``, ``shared_dir`` (a directory all ranks of this
    world share, removed afterwards), ``device`` (always CPU here), ``step(i)`` (the
    progress heartbeat and the clock faults use), ``fault(kind)`` and ``ddp(model)``; ``spec`` is the world's
    :class:`~ddpfaults.spec.RunSpec` (``world_size``, ``seed``, ``backend`` and ``peer_failure`` are its).
    ``clock`` is who announces steps: None (the function calls ``step``), ``"optimizer"`` or
    ``"dataloader"`` (a script world's seams, :mod:`ddpfaults.rank.seams`).
    """

    def __init__(
        self,
        *,
        rank: int,
        spec: RunSpec,
        shared_dir: str,
        faults: tuple,
        events: EventLog,
        clock: str | None = None,
        attempt: int = 0,
    ):
        self.rank = rank
        self.call_group = None  # (members, group_desc) of the traced call being made, None on the default group
        self.attempt = attempt  # the run of a restarted world (TORCHELASTIC_RESTART_COUNT): its faults act
        self.spec = spec
        self.world_size = spec.world_size
        self.seed = spec.seed
        self.shared_dir = shared_dir
        self.backend = spec.backend
        self.peer_failure = spec.peer_failure
        self.device = torch.device("cpu")
        self.faults = tuple(faults)
        self.current_step: int | None = None
        self.clock = clock
        self.batches = 0  # DataLoader batches yielded on this rank so far (the dataloader clock)
        self.iterators = 0  # DataLoader iterators that yielded on this rank so far
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
        effects.step_starts()
        active = self._active()
        for fault in active:
            effects.arm(self, fault)
        for fault in active:
            if fault.acts_on_step:
                self.record_fired(fault, "on_step", effect="on_step", signal=fault.kills_with)
                fault.on_step(self)

    def log(self, message: str) -> None:
        """Record a free-form message in this rank's timeline (counts as progress)."""
        self._events.emit("log", msg=str(message), step=self.current_step)

    # -- faults -------------------------------------------------------------------------
    def attempt_faults(self) -> list:
        """The faults of this world that act in this attempt (see :attr:`~ddpfaults.faults.Fault.attempt`)."""
        return [f for f in self.faults if f.attempt == self.attempt]

    def _active(self):
        return [f for f in self.attempt_faults() if f.applies(self.rank, self.current_step)]

    def fault(self, kind: type):
        """The fault of type ``kind`` that applies to this rank at the current step, or None.

        Asking marks the fault as fired (the scenario is about to act on it), and claims ``kind`` on this
        rank: from then on torch's seams (DataLoader, DDP construction) leave faults of that kind alone.
        """
        self._claimed.add(kind)
        for fault in self._active():
            if isinstance(fault, kind):
                self.record_fired(fault, "queried", effect="queried")
                return fault
        return None

    def unclaimed_faults(self) -> list:
        """The faults of this world that the function has not claimed with ``ctx.fault`` (the seams' to apply)."""
        return [f for f in self.attempt_faults() if not isinstance(f, tuple(self._claimed))]

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

    def record_fired(
        self,
        fault,
        how: str,
        *,
        effect: str,
        signal: str | None = None,
        file: str | None = None,
        step: int | None = None,
    ) -> None:
        """Record in this rank's timeline that ``fault`` took effect: ``how`` says what it did in words, ``effect``
        as data (one of :data:`ddpfaults.events.EFFECTS`), ``signal`` the signal it kills the rank with, if any,
        ``file`` the file it cut on disk (a checkpoint fault's, resolved), if any, ``step`` the step it acted for
        (default: the current one; a checkpoint written in one step is complete as the next starts)."""
        self._events.emit(
            "fault",
            index=self.faults.index(fault),
            fault=repr(fault),
            how=how,
            step=self.current_step if step is None else step,
            effect=effect,
            signal=signal,
            **({"file": file} if file is not None else {}),
        )

    def record_read(self, event: dict) -> None:
        """Record in this rank's timeline a file it opened for reading (``event``: a ``file`` event of
        :mod:`ddpfaults.rank.files`): the evidence that it read a checkpoint a fault cut before a restart."""
        self._events.emit("file", **{k: event[k] for k in ("how", "path", "mode", "size", "step") if k in event})

    # -- collectives ----------------------------------------------------------------------
    def batch_drawn(self, iterator: int, yielded: int) -> None:
        """A DataLoader iterator (the rank's ``iterator``-th, from 1) yielded its ``yielded``-th batch: the rank's
        ``batches``-th. The event carries the default group's sequence number, to place recorded collectives."""
        self._events.emit("batch", index=self.batches, it=iterator, n=yielded, pg_seq=default_group_seq())
        self.batches += 1

    def loader_ended(self, iterator: int, yielded: int) -> None:
        """A DataLoader iterator (the rank's ``iterator``-th) ran out after ``yielded`` batches: the rank's loop over
        it ends here."""
        self._events.emit("loader_end", it=iterator, yielded=yielded)

    def _enter(self, op: str, shapes: list, site: str, note: str = "", maker: str = "user", **facts) -> int:
        """Record that this rank entered ``op`` (``maker``: who made it, one of :data:`ddpfaults.events.MAKERS`);
        ``facts``: what the judge's deadlock proof needs to know of the call (see :func:`_call_facts`)."""
        self._seq += 1
        batch = {"batch": self.batches - 1} if self.batches else {}
        self._events.emit(
            "enter",
            seq=self._seq,
            op=op,
            shapes=shapes,
            site=site,
            step=self.current_step,
            note=note,
            maker=maker,
            **batch,
            **facts,
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
        label = events.MAKERS["ddp_bucket"]
        seq = self._enter(
            "all_reduce", [list(buffer.shape)], call_site(), f"{label} {bucket.index()}", "ddp_bucket", **facts
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
            torch_private.queue_after_backward(announce)
        except RuntimeError:
            self._last_bucket_launched = False
            return
        self._finalize_queued = True


def _is_default(group) -> bool:
    """True if ``group`` (None: the default) is the default process group."""
    try:
        return group is None or group is torch_private.default_group()
    except (RuntimeError, ValueError):  # no default group
        return False


def building_traced_ddp() -> bool:
    """True while ``ctx.ddp`` constructs its DDP model (it installs its own comm hook next)."""
    return getattr(_local, "traced_ddp", False)


def skipped_bucket(ctx: RankContext, bucket) -> torch.futures.Future | None:
    """When a fault skips this DDP gradient bucket's all_reduce: a done future holding the rank's own gradients."""
    for fault in ctx._active():
        if effects.skips_collective(ctx, fault, DDP_BUCKET):
            ctx.record_fired(fault, f"skipped the all_reduce of DDP gradient bucket {bucket.index()}", effect="skipped")
            future = torch.futures.Future()
            future.set_result(bucket.buffer())
            return future
    return None


def entering(ctx: RankContext, op: str, maker: str = "user") -> None:
    """The rank enters collective ``op`` made by ``maker`` (``"ddp_bucket"``: a DDP gradient bucket): the faults that
    act there."""
    for fault in ctx._active():
        done = effects.before_collective(ctx, fault, op, maker)
        if done is not None:
            ctx.record_fired(fault, done, effect="at_collective")
