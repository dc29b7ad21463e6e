"""Faults are values: what goes wrong, on which rank, at which step.

Every fault has a keyword-only constructor that validates its arguments, a
``check_world(world_size)`` that validates it against the world it is given to,
and a ``repr`` that is valid Python rebuilding it (so a failing plan can be pasted
into a regression test). Inside a rank, the engine calls ``on_step`` when the
rank announces a step and ``skips_collective`` before each traced collective;
data faults (``EmptyBatch``, ``SchemaDrift``, ``DeviceMismatch``, ``UnevenInputs``) are
asked for by scenario code through ``ctx.fault(EmptyBatch)``; checkpoint faults
(``TornCheckpointWrite``, ``WriterKilledMidSave``) intercept ``torch.save`` /
``torch.load`` in the rank, so the code under test needs no change. Whenever a
fault takes effect it is recorded as fired. (The interception lives in this file
on purpose: its frames count as machinery, never as the site of a user's error.)
"""

from __future__ import annotations

import io
import math
import os
import signal
import time
from typing import Iterable

from .errors import FaultError


def _as_tuple(name: str, value, owner: str) -> tuple[int, ...] | None:
    """Normalise an int / iterable of ints / None into a sorted tuple, validating each item."""
    if value is None:
        return None
    try:
        items = (value,) if isinstance(value, int) else tuple(value)
    except TypeError:
        items = (value,)
    for item in items:
        if isinstance(item, bool) or not isinstance(item, int) or item < 0:
            raise FaultError(f"{owner}: {name} must be a non-negative int or a list of them, got {value!r}")
    if not items:
        raise FaultError(f"{owner}: {name} must not be empty")
    return tuple(sorted(set(items)))


def _fmt(values: tuple[int, ...] | None) -> str:
    if values is None:
        return "None"
    return str(values[0]) if len(values) == 1 else repr(list(values))


class Fault:
    """Base class of all faults: a set of ranks and (optionally) a set of steps where it applies.

    ``steps=None`` means every step. Subclasses define the effect.
    """

    #: argument name used for the ranks in ``repr`` (``writer`` for checkpoint faults)
    rank_arg = "rank"

    def __init__(self, *, rank=None, step=None):
        name = type(self).__name__
        self.ranks = _as_tuple(self.rank_arg, rank, name)
        self.steps = _as_tuple("step", step, name)

    def check_world(self, world_size: int) -> None:
        """Raise :class:`FaultError` if this fault names a rank outside a world of ``world_size``."""
        for r in self.ranks or ():
            if r >= world_size:
                raise FaultError(
                    f"{self!r}: {self.rank_arg} {r} does not exist in a world of {world_size} ranks "
                    f"(valid ranks are 0..{world_size - 1})"
                )

    def applies(self, rank: int, step: int | None) -> bool:
        """True if this fault targets ``rank`` at ``step`` (``step=None``: outside any step)."""
        if self.ranks is not None and rank not in self.ranks:
            return False
        if self.steps is None:
            return True
        return step is not None and step in self.steps

    # -- hooks called inside a rank ------------------------------------------------------
    def on_step(self, ctx) -> None:
        """Called when ``ctx.step(i)`` is announced on a rank and step this fault applies to."""

    def skips_collective(self, ctx, op: str) -> bool:
        """Return True to make the rank skip collective ``op`` (called only where the fault applies)."""
        return False

    # -- values --------------------------------------------------------------------------
    def _fields(self) -> dict:
        fields = {self.rank_arg: _fmt(self.ranks)}
        if self.steps is not None:
            fields["step"] = _fmt(self.steps)
        return fields

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v}" for k, v in self._fields().items() if v != "None")
        return f"{type(self).__name__}({args})"

    def __eq__(self, other) -> bool:
        return type(self) is type(other) and repr(self) == repr(other)

    def __hash__(self) -> int:
        return hash(repr(self))


def _require_step(fault: Fault) -> None:
    if fault.steps is None:
        raise FaultError(f"{type(fault).__name__}: step is required")


def _require_rank(fault: Fault) -> None:
    if fault.ranks is None:
        raise FaultError(f"{type(fault).__name__}: {fault.rank_arg} is required")


class RankCrash(Fault):
    """``rank`` raises ``exc`` when it announces ``step``.

    ``exc`` is an exception instance or class (default ``RuntimeError("injected crash")``);
    it must be picklable since it travels to the rank.
    """

    def __init__(self, *, rank, step, exc: BaseException | type | None = None):
        super().__init__(rank=rank, step=step)
        _require_rank(self)
        _require_step(self)
        if exc is None:
            exc = RuntimeError("injected crash")
        if isinstance(exc, type) and issubclass(exc, BaseException):
            exc = exc("injected crash")
        if not isinstance(exc, BaseException):
            raise FaultError(f"RankCrash: exc must be an exception instance or class, got {exc!r}")
        self.exc = exc

    def on_step(self, ctx) -> None:
        """Raise the configured exception."""
        raise self.exc

    def _fields(self) -> dict:
        return {**super()._fields(), "exc": f"{type(self.exc).__name__}({', '.join(map(repr, self.exc.args))})"}


class Straggler(Fault):
    """``rank`` computes hard (burning CPU, not sleeping) for ``seconds`` at ``step``."""

    def __init__(self, *, rank, step, seconds: float):
        super().__init__(rank=rank, step=step)
        _require_rank(self)
        _require_step(self)
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 < seconds < math.inf:
            raise FaultError(f"Straggler: seconds must be a positive finite number, got {seconds!r}")
        self.seconds = float(seconds)

    def on_step(self, ctx) -> None:
        """Busy-loop on the CPU for the configured time."""
        end = time.monotonic() + self.seconds
        x = 0
        while time.monotonic() < end:
            for i in range(10_000):
                x += i * i

    def _fields(self) -> dict:
        return {**super()._fields(), "seconds": repr(self.seconds)}


class SkippedCollective(Fault):
    """``rank`` silently skips the first collective (optionally only of kind ``op``) at ``step``."""

    def __init__(self, *, rank, step, op: str | None = None):
        super().__init__(rank=rank, step=step)
        _require_rank(self)
        _require_step(self)
        if op is not None and not isinstance(op, str):
            raise FaultError(f"SkippedCollective: op must be a collective name like 'all_reduce', got {op!r}")
        self.op = op

    def skips_collective(self, ctx, op: str) -> bool:
        """Skip once per (rank, step): the first matching collective."""
        if self.op is not None and op != self.op:
            return False
        return ctx._once(self)

    def _fields(self) -> dict:
        fields = super()._fields()
        if self.op is not None:
            fields["op"] = repr(self.op)
        return fields


class RankOnlyBarrier(Fault):
    """``rank`` alone calls ``dist.barrier()`` at ``step`` (e.g. ``if rank == 0: dist.barrier()``)."""

    def __init__(self, *, rank, step):
        super().__init__(rank=rank, step=step)
        _require_rank(self)
        _require_step(self)

    def on_step(self, ctx) -> None:
        """Enter a barrier the other ranks never call."""
        import torch.distributed as dist

        dist.barrier()


# -- data faults: asked for by scenario code with ctx.fault(Kind) ------------------------------


class EmptyBatch(Fault):
    """``rank``'s batch at ``step`` has no valid instances: targets with zero rows, same schema.

    Scenario code asks ``f = ctx.fault(EmptyBatch)`` and, when it is set, passes its batch
    targets through ``f.apply(targets)``.
    """

    def __init__(self, *, rank, step):
        super().__init__(rank=rank, step=step)
        _require_rank(self)
        _require_step(self)

    def apply(self, targets: list) -> list:
        """The same targets with every per-instance field cut to zero rows (keys, dtypes, shapes kept)."""
        from .data import fake_target_like

        return [fake_target_like(t) for t in targets]


class SchemaDrift(Fault):
    """Real targets carry an extra required ``key`` that a hand-written fake target does not know.

    ``apply(target)`` gives a real target the key (a no-op when the data already has it, as the
    toy data has ``segment_mask``); ``require(targets)`` is the consumer that reads it and raises
    ``KeyError: key`` for a target without it, as the matcher does. Every rank by default.
    """

    def __init__(self, *, key: str, rank=None, step=None):
        super().__init__(rank=rank, step=step)
        if not isinstance(key, str) or not key.strip():
            raise FaultError(f"SchemaDrift: key must be a non-empty string like 'segment_mask', got {key!r}")
        self.key = key

    def apply(self, target: dict) -> dict:
        """``target`` with ``key`` present: added as a bool ``[K]`` per-instance flag if the data lacks it."""
        if self.key in target:
            return target
        import torch

        rows = len(target["labels"]) if "labels" in target else 0
        return {**target, self.key: torch.ones(rows, dtype=torch.bool)}

    def require(self, targets: list) -> None:
        """Read ``key`` from every target, raising ``KeyError(key)`` like the criterion's matcher."""
        for target in targets:
            target[self.key]

    def _fields(self) -> dict:
        return {"key": repr(self.key), **super()._fields()}


class DeviceMismatch(Fault):
    """The model stays on the CPU while the launcher hands each rank an accelerator-style device.

    ``launcher_device(rank)`` is ``torch.device(device_type, rank)`` (``xla:{rank}`` by default, as
    in report 004): a naive wrap turns it into ``device_ids=[rank]``. Every rank by default.
    """

    def __init__(self, *, device_type: str = "xla", rank=None, step=None):
        super().__init__(rank=rank, step=step)
        if not isinstance(device_type, str) or not device_type.isidentifier() or device_type == "cpu":
            raise FaultError(f"DeviceMismatch: device_type must name an accelerator like 'xla', got {device_type!r}")
        self.device_type = device_type

    def launcher_device(self, rank: int):
        """The device the launcher hands to ``rank``."""
        import torch

        return torch.device(self.device_type, rank)

    def _fields(self) -> dict:
        fields = super()._fields()
        if self.device_type != "xla":
            fields["device_type"] = repr(self.device_type)
        return fields


class UnevenInputs(Fault):
    """``rank``'s loader yields only ``batches`` batches (the other ranks' loaders are longer).

    Scenario code asks ``f = ctx.fault(UnevenInputs)`` before its loop (or at any step) and
    iterates ``f.limit(loader)``. ``batches=0``: the rank never enters the training loop.
    """

    def __init__(self, *, rank, batches: int):
        super().__init__(rank=rank)
        _require_rank(self)
        if isinstance(batches, bool) or not isinstance(batches, int) or batches < 0:
            raise FaultError(f"UnevenInputs: batches must be a non-negative int, got {batches!r}")
        self.batches = batches

    def limit(self, loader):
        """An iterator over at most ``batches`` items of ``loader``."""
        import itertools

        return itertools.islice(loader, self.batches)

    def _fields(self) -> dict:
        return {**super()._fields(), "batches": repr(self.batches)}


# -- checkpoint faults: intercept torch.save / torch.load in the rank ----------------------------


class _CheckpointFault(Fault):
    """A fault on the ``writer`` rank's ``torch.save`` (armed when a step it applies to starts)."""

    rank_arg = "writer"

    def __init__(self, *, writer: int = 0, step=None):
        if isinstance(writer, bool) or not isinstance(writer, int) or writer < 0:
            raise FaultError(f"{type(self).__name__}: writer must be a non-negative int (a rank), got {writer!r}")
        super().__init__(rank=writer, step=step)

    @property
    def writer(self) -> int:
        """The rank whose save is hit."""
        return self.ranks[0]

    def on_step(self, ctx) -> None:
        """Arm the torch.save/torch.load interception in this rank (idempotent)."""
        _install_checkpoint_hooks()

    def _fields(self) -> dict:
        fields = {"writer": str(self.writer)}
        if self.steps is not None:
            fields["step"] = _fmt(self.steps)
        return fields


class TornCheckpointWrite(_CheckpointFault):
    """The ``writer``'s ``torch.save`` is held mid-file until every other rank has tried to load it
    (or is waiting in a collective the writer has not reached), then completes.

    Deterministic, no sleeps: a reader's ``torch.load`` at that step first waits for the writer to
    be mid-file, so a reader that does not synchronise reads a truncated file
    (``failed finding central directory``); a reader behind a barrier never sees it. The
    handshake uses flag files in ``ctx.shared_dir``. Applies on every rank (readers take part).
    """

    def applies(self, rank: int, step: int | None) -> bool:
        """Every rank, at the fault's steps: the writer tears, the readers take part in the handshake."""
        return self.steps is None or (step is not None and step in self.steps)

    def skips_collective(self, ctx, op: str) -> bool:
        """On a reader, note the collective it enters (the writer stops holding for a reader blocked there)."""
        entered = _count_collective(ctx)
        if ctx.rank != self.writer:
            _write_flag(_flag(ctx, f"calls.{ctx.rank}"), str(entered))
        return False


class WriterKilledMidSave(_CheckpointFault):
    """The ``writer`` process SIGKILLs itself halfway through writing a checkpoint (``torch.save``).

    The engine reports it DIED ("was killed by SIGKILL"). An in-place save leaves a truncated
    checkpoint; an atomic one (temp file + ``os.replace``) leaves the last good one intact.
    """


#: upper bound of any checkpoint handshake wait: only reached if a peer died before taking part
HANDSHAKE_LIMIT = 30.0


def _flag(ctx, name: str) -> str:
    directory = os.path.join(ctx.shared_dir, ".ddpfaults-checkpoint")
    os.makedirs(directory, exist_ok=True)
    return os.path.join(directory, name)


def _write_flag(path: str, text: str = "") -> None:
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


def _wait_for(condition) -> bool:
    """Poll ``condition`` (a handshake, not a timing guess); False only after :data:`HANDSHAKE_LIMIT`."""
    deadline = time.monotonic() + HANDSHAKE_LIMIT
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.002)
    return True


def _count_collective(ctx) -> int:
    """Count the traced collectives this rank enters at the torn steps (the same order on every rank)."""
    ctx._ddpfaults_torn_calls = getattr(ctx, "_ddpfaults_torn_calls", 0) + 1
    return ctx._ddpfaults_torn_calls


def _armed(kind) -> tuple:
    """The current rank context and its checkpoint faults of ``kind`` that apply now (none between jobs)."""
    from . import context

    ctx = context.current()
    if ctx is None:
        return None, []
    return ctx, [f for f in ctx.faults if isinstance(f, kind) and f.applies(ctx.rank, ctx.current_step)]


def _install_checkpoint_hooks() -> None:
    """Route this process's torch.save / torch.load through :func:`_armed` (patched once, inert when unarmed)."""
    import torch

    if getattr(torch.save, "__ddpfaults_checkpoint__", False):
        return
    original_save, original_load = torch.save, torch.load

    def save(obj, f, *args, **kwargs):
        """torch.save, interrupted halfway on the writer of an armed checkpoint fault."""
        active, faults = _armed(_CheckpointFault)
        for armed in faults:
            if active.rank == armed.writer:
                buffer = io.BytesIO()
                original_save(obj, buffer, *args, **kwargs)
                return _write_interrupted(active, armed, buffer.getvalue(), f)
        return original_save(obj, f, *args, **kwargs)

    def load(f, *args, **kwargs):
        """torch.load; on a reader at a torn step it first waits for the writer to be mid-file."""
        active, torn = _armed(TornCheckpointWrite)
        torn = [a for a in torn if active.rank != a.writer]
        if not torn:
            return original_load(f, *args, **kwargs)
        mid = _flag(active, f"mid.{active.current_step}")
        if _wait_for(lambda: os.path.exists(mid)):
            done = os.path.exists(_flag(active, f"done.{active.current_step}"))
            state = "after the writer's held save had completed" if done else "while the writer was mid-file"
            active._fired(torn[0], f"torch.load of {_name(f)} started {state}")
        try:
            return original_load(f, *args, **kwargs)
        finally:
            _write_flag(_flag(active, f"load.{active.current_step}.{active.rank}"))

    save.__ddpfaults_checkpoint__ = load.__ddpfaults_checkpoint__ = True
    torch.save, torch.load = save, load


def _name(f) -> str:
    name = os.fspath(f) if isinstance(f, (str, os.PathLike)) else getattr(f, "name", None)
    return os.path.basename(name) if isinstance(name, str) else type(f).__name__


def _write_interrupted(ctx, fault: _CheckpointFault, data: bytes, f) -> None:
    """Write half of ``data`` to ``f`` (path or binary file), durably; then tear or die as ``fault`` says."""
    owned = isinstance(f, (str, os.PathLike))
    handle = open(f, "wb") if owned else f
    try:
        half = len(data) // 2
        handle.write(data[:half])
        handle.flush()
        if hasattr(handle, "fileno"):
            os.fsync(handle.fileno())
        where = f"{_name(f)} after {half} of {len(data)} bytes"
        if isinstance(fault, WriterKilledMidSave):
            ctx._fired(fault, f"SIGKILLed the writer mid-save of {where}")
            os.kill(os.getpid(), signal.SIGKILL)
        readers = [r for r in range(ctx.world_size) if r != ctx.rank]
        _write_flag(_flag(ctx, f"mid.{ctx.current_step}"))
        released = _wait_for(lambda: all(_reader_done(ctx, r) for r in readers))
        how = "every reader had tried to load it or was waiting in a collective" if released else (
            f"the {HANDSHAKE_LIMIT:g} s handshake limit")
        ctx._fired(fault, f"held torch.save of {where} until {how}")
        handle.write(data[half:])
        handle.flush()
        _write_flag(_flag(ctx, f"done.{ctx.current_step}"))
    finally:
        if owned:
            handle.close()


def _reader_done(ctx, reader: int) -> bool:
    """True if ``reader`` tried a load at this step, or entered a collective this writer has not reached."""
    if os.path.exists(_flag(ctx, f"load.{ctx.current_step}.{reader}")):
        return True
    try:
        with open(_flag(ctx, f"calls.{reader}")) as f:
            return int(f.read() or 0) > getattr(ctx, "_ddpfaults_torn_calls", 0)
    except FileNotFoundError:
        return False


def check_faults(faults: Iterable[Fault], world_size: int) -> tuple[Fault, ...]:
    """Validate a fault plan against a world; return it as a tuple."""
    faults = tuple(faults)
    for i, fault in enumerate(faults):
        if not isinstance(fault, Fault):
            raise FaultError(f"faults[{i}] is {fault!r}, not a ddpfaults fault (see ddpfaults.faults)")
        fault.check_world(world_size)
    return faults
