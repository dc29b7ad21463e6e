"""Checkpoint faults taking effect inside a rank: the file on disk (``WriterKilledMidSave``), ``torch.save`` /
``torch.load`` interception (``TornCheckpointWrite``).

``WriterKilledMidSave`` acts on the file its writer writes in the fault's step, whatever writes it (``torch.save``
to a path, ``open(path, "wb")`` of a buffer, numpy), seen through the rank's file record
(:mod:`ddpfaults.rank.files`): once the file is complete (the writer moves on: another file event, such as the
``os.replace`` of an atomic save, a collective, the next step or the job's end), it is cut to half its bytes, made
durable, and the writer SIGKILLed — before the rename of an atomic save, so the old checkpoint stays, as under
torchrun. Files smaller than :data:`SMALLEST_CHECKPOINT` (a ``latest`` pointer, a marker) are left whole: the
checkpoint is the first larger one.

``TornCheckpointWrite`` has :func:`install` called when a step it applies to starts (:mod:`ddpfaults.rank.effects`);
from then on this process's ``torch.save`` and ``torch.load`` consult the running job's rank context
(:mod:`ddpfaults.rank.running`) and are inert unless it applies at its current step. The writer's save is written
half, then held until every reader took part; a reader's load at a torn step first waits for the writer to be
mid-file. The handshake uses flag files in ``ctx.shared_dir``, never sleeps guessed from timings.

This module lives under ``ddpfaults/rank/`` on purpose: its frames count as machinery
(:func:`ddpfaults.rank.context.is_machinery`), never as the site of a user's error.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import time
import weakref

import torch

from ddpfaults.faults.checkpoint import TornCheckpointWrite, WriterKilledMidSave
from ddpfaults.rank import files, running

#: upper bound of any checkpoint handshake wait: only reached if a peer died before taking part
HANDSHAKE_LIMIT = 30.0

#: traced collectives each rank context entered at torn steps (one counter per job's context)
_entered: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def install() -> None:
    """Route this process's torch.save / torch.load through the armed checkpoint faults (patched once)."""
    if getattr(torch.save, "__ddpfaults_checkpoint__", False):
        return
    original_save, original_load = torch.save, torch.load

    def save(obj, f, *args, **kwargs):
        """torch.save, interrupted halfway on the writer of an armed checkpoint fault."""
        active, faults = _armed(TornCheckpointWrite)
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
            active.record_fired(torn[0], f"torch.load of {_name(f)} started {state}", effect="checkpoint")
        try:
            return original_load(f, *args, **kwargs)
        finally:
            _write_flag(_flag(active, f"load.{active.current_step}.{active.rank}"))

    save.__ddpfaults_checkpoint__ = load.__ddpfaults_checkpoint__ = True
    torch.save, torch.load = save, load


def note_collective(ctx, writer: int) -> None:
    """Count a traced collective ``ctx``'s rank enters at a torn step (the same order on every rank);
    a reader (any rank but ``writer``) publishes its count, so a held writer sees it blocked there."""
    entered = _entered.get(ctx, 0) + 1
    _entered[ctx] = entered
    if ctx.rank != writer:
        _write_flag(_flag(ctx, f"calls.{ctx.rank}"), str(entered))


def _flag(ctx, name: str) -> str:
    """Path of handshake flag ``name`` in the world's shared directory."""
    directory = os.path.join(ctx.shared_dir, ".ddpfaults-checkpoint")
    os.makedirs(directory, exist_ok=True)
    return os.path.join(directory, name)


def _write_flag(path: str, text: str = "") -> None:
    """Write a flag file atomically (readers see it whole or not at all)."""
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


def _armed(kind) -> tuple:
    """The current rank context and its checkpoint faults of ``kind`` that apply now (none between jobs)."""
    ctx = running.current()
    if ctx is None:
        return None, []
    return ctx, [f for f in ctx.attempt_faults() if isinstance(f, kind) and f.applies(ctx.rank, ctx.current_step)]


def _name(f) -> str:
    """The base name of a checkpoint target (a path or a file object), for the fired-fault text."""
    name = os.fspath(f) if isinstance(f, (str, os.PathLike)) else getattr(f, "name", None)
    return os.path.basename(name) if isinstance(name, str) else type(f).__name__


def _write_interrupted(ctx, fault: TornCheckpointWrite, data: bytes, f) -> None:
    """Write half of ``data`` to ``f`` (path or binary file), durably; hold it until every reader took part, then
    write the rest."""
    owned = isinstance(f, (str, os.PathLike))
    with open(f, "wb") if owned else contextlib.nullcontext(f) as handle:
        half = len(data) // 2
        handle.write(data[:half])
        handle.flush()
        if hasattr(handle, "fileno"):
            os.fsync(handle.fileno())
        where = f"{_name(f)} after {half} of {len(data)} bytes"
        readers = [r for r in range(ctx.world_size) if r != ctx.rank]
        _write_flag(_flag(ctx, f"mid.{ctx.current_step}"))
        released = _wait_for(lambda: all(_reader_done(ctx, r) for r in readers))
        how = (
            "every reader had tried to load it or was waiting in a collective"
            if released
            else f"the {HANDSHAKE_LIMIT:g} s handshake limit"
        )
        ctx.record_fired(fault, f"held torch.save of {where} until {how}", effect="checkpoint")
        handle.write(data[half:])
        handle.flush()
        _write_flag(_flag(ctx, f"done.{ctx.current_step}"))


def _reader_done(ctx, reader: int) -> bool:
    """True if ``reader`` tried a load at this step, or entered a collective this writer has not reached."""
    if os.path.exists(_flag(ctx, f"load.{ctx.current_step}.{reader}")):
        return True
    try:
        with open(_flag(ctx, f"calls.{reader}")) as f:
            return int(f.read() or 0) > _entered.get(ctx, 0)
    except FileNotFoundError:
        return False


#: the smallest file :class:`WriterKilledMidSave` takes for the checkpoint (``torch.save`` of an empty dict writes
#: 1261 bytes; a ``latest`` pointer or a marker file is far smaller)
SMALLEST_CHECKPOINT = 512


class _Window:
    """An armed ``WriterKilledMidSave`` on its writer: the file being written in its step (None: none yet)."""

    def __init__(self, ctx, fault: WriterKilledMidSave):
        self.ctx, self.fault, self.writing = ctx, fault, None

    def note(self, event: dict) -> None:
        """A file event of the writer's job: the file it was writing is complete (it moved on); the next is noted."""
        if not self.fault.applies(self.ctx.rank, self.ctx.current_step):
            return
        self.complete()
        if event["how"] == "wrote":
            self.writing = event["path"]

    def complete(self) -> None:
        """The file being written is complete: unless it is smaller than a checkpoint, cut it to half its bytes,
        durably, and SIGKILL the writer."""
        path, self.writing = self.writing, None
        if path is None or running.current() is not self.ctx:
            return
        try:
            size = os.stat(path).st_size
        except OSError:
            return  # moved away already, or removed: nothing of it to cut
        if size < SMALLEST_CHECKPOINT:
            return
        half = size // 2
        fd = os.open(path, os.O_WRONLY)
        try:
            os.ftruncate(fd, half)
            os.fsync(fd)
        finally:
            os.close(fd)
        name = os.path.basename(path)
        how = f"SIGKILLed the writer mid-save of {name} after {half} of {size} bytes were on disk ({path})"
        self.ctx.record_fired(self.fault, how, effect="checkpoint", signal="SIGKILL")
        os.kill(os.getpid(), signal.SIGKILL)


_window: _Window | None = None


def kill_mid_file(ctx, fault: WriterKilledMidSave) -> None:
    """Arm ``fault`` on its writer as a step it applies to starts: watch the files its job writes (not yet an effect:
    it fires when a file is cut and the writer killed; a step that writes none leaves it unfired)."""
    global _window
    if ctx.rank != fault.writer:
        return
    window_ends()
    _window = _Window(ctx, fault)
    files.listen(ctx, _window.note, first=True)  # it kills before a rename happens: no one else notes it


def window_ends(ctx=None) -> None:
    """The writer moved on: the file it was writing is complete (cut, and the writer killed, there). ``ctx`` given
    (it enters a collective): only the armed job's, and the window stays open; else (its next step starts, its job
    ends) the window closes."""
    global _window
    window = _window
    if window is None or (ctx is not None and window.ctx is not ctx):
        return
    window.complete()
    if ctx is None:
        files.unlisten(window.ctx, window.note)
        _window = None
