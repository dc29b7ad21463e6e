"""Checkpoint faults taking effect inside a rank, at the checkpoint file on disk, whatever writes it (``torch.save``
to a path, ``open(path, "wb")`` of a buffer, numpy), seen through the rank's file record (:mod:`ddpfaults.rank.files`).

The writer's checkpoint is the first file of at least :data:`SMALLEST_CHECKPOINT` bytes it writes in the fault's step
(a ``latest`` pointer or a marker is left whole). It is complete when the writer moves on: another file event (such
as the ``os.replace`` of an atomic save, before the rename happens), a collective, the next step or the job's end.
Then:

- ``WriterKilledMidSave``: the file is cut to half its bytes, made durable, and the writer SIGKILLed — before the
  rename of an atomic save, so the old checkpoint stays, as under torchrun;
- ``TornCheckpointWrite``: the file is cut to half its bytes and the writer held there until every reader has moved
  on, then the rest is written back and the writer goes on. A reader's read (an ``open`` for reading, whatever
  issues it: ``torch.load``, ``open``, numpy) at that step first waits until the writer holds its file torn, or is
  known elsewhere (blocked in a collective the reader has not reached, past its step); a reader that opened the torn
  file has moved on at its next other file event, collective, step or the job's end. So a reader that does not
  synchronise with the writer reads the torn file, a reader behind a barrier the whole one, and a reader of an
  atomic save's target the old checkpoint.

A reader stays armed past the fault's step until the writer is done with its file (or past its step without one): a
checkpoint saved at a step's end and complete only as the next step starts is read there.

The handshake uses flag files in ``ctx.shared_dir`` (keyed by attempt and step), never sleeps guessed from timings.
Each armed rank publishes how many collectives it has entered, sends left out (:func:`_count`): each of its process
groups counts every call it issued, whatever door issued it (DDP's reducer and its forward's broadcasts, FSDP, the
user's calls), and a thread of the rank's publishes the count while its main thread waits in one. So a held writer
stops waiting for a reader blocked in a collective, a reader for a writer blocked in one, and a writer's file is
complete once it entered a collective nobody traced (acted on there, by that thread, while the writer waits in it).

This module lives under ``ddpfaults/rank/`` on purpose: its frames count as machinery
(:func:`ddpfaults.rank.context.is_machinery`), never as the site of a user's error.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import threading
import time
import weakref

from ddpfaults.faults.checkpoint import TornCheckpointWrite, WriterKilledMidSave
from ddpfaults.rank import files, running, torch_private

#: upper bound of any checkpoint handshake wait: only reached if a peer died before taking part
HANDSHAKE_LIMIT = 30.0

#: the smallest file taken for the checkpoint (``torch.save`` of an empty dict writes 1261 bytes; a ``latest``
#: pointer or a marker file is far smaller)
SMALLEST_CHECKPOINT = 512

#: traced collectives (sends left out) each rank context entered at torn steps, and traced sends since its window
#: was armed (per job's context)
_entered: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_sent: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
#: how many calls the rank's process groups had issued as each rank context's window was armed: counts are compared
#: from there (every rank arms at the same step's start; ranks that sent or received more before it do not differ)
_base: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class _Window:
    """An armed checkpoint fault on its writer: the file being written in the fault's step (None: none yet), acted on
    (:meth:`act`) once the first file of a checkpoint's size is complete. Its main thread notes file events, its
    publisher thread the collectives it entered: one lock orders them."""

    def __init__(self, ctx, fault):
        self.ctx, self.fault, self.step = ctx, fault, ctx.current_step
        self.writing: str | None = None
        self.since = 0  # the rank's count of collectives as it began writing that file
        self.spent = False
        self.lock = threading.RLock()

    def note(self, event: dict) -> None:
        """A file event of the writer's job: the file it was writing is complete (it moved on); the next is noted."""
        with self.lock:
            self.complete()
            if event["how"] == "wrote" and not self.spent and self.fault.applies(self.ctx.rank, self.ctx.current_step):
                self.writing, self.since = event["path"], _count(self.ctx)

    def counted(self, count: int) -> None:
        """The publisher read the rank's count: past the one it had as it began writing its file, the rank entered a
        collective since (one nobody traced): the file is complete, acted on while the rank waits in it."""
        with self.lock:
            if self.writing is not None and count > self.since:
                self.complete(inside=True)

    def complete(self, inside: bool = False) -> None:
        """The file being written is complete: unless it is smaller than a checkpoint, act on it (``inside``: the
        rank is inside a collective already)."""
        with self.lock:
            path, self.writing = self.writing, None
            if path is None or self.spent or running.current() is not self.ctx:
                return
            try:
                size = os.stat(path).st_size
            except OSError:
                return  # moved away already, or removed: nothing of it to cut
            if size < SMALLEST_CHECKPOINT:
                return
            self.spent = True
            with files.quiet():  # the fault's own reads and writes of the file are no file events of the job
                self.act(path, size, inside)

    def act(self, path: str, size: int, inside: bool) -> None:
        """``WriterKilledMidSave``: cut the file to half its bytes, durably, and SIGKILL the writer."""
        half = size // 2
        _cut(path, half)
        name = os.path.basename(path)
        how = f"SIGKILLed the writer mid-save of {name} after {half} of {size} bytes were on disk ({path})"
        self.ctx.record_fired(self.fault, how, effect="checkpoint", signal="SIGKILL", file=path, step=self.step)
        os.kill(os.getpid(), signal.SIGKILL)

    def finished(self) -> bool:
        """Always: a writer's window closes as its step ends (its file acted on, or none written)."""
        return True

    def close(self) -> None:
        """The writer's step or job ends."""


class _TornWindow(_Window):
    """An armed ``TornCheckpointWrite`` on its writer."""

    def act(self, path: str, size: int, inside: bool) -> None:
        """Cut the file to half its bytes and hold the writer until every reader moved on (``inside``: the writer
        waits in a collective, which a reader entering moves it on; else one the writer has yet to enter does), then
        write the rest."""
        ctx = self.ctx
        with open(path, "rb") as f:
            data = f.read()
        half = len(data) // 2
        _cut(path, half)
        _write_flag(_flag(ctx, self.step, "mid"), json.dumps({"path": path, "size": len(data)}))
        readers = [r for r in range(ctx.world_size) if r != ctx.rank]
        past = _count(ctx) + (0 if inside else 1)
        released = _wait_for(lambda: all(_moved_on(ctx, self.step, r, past) for r in readers))
        fd = os.open(path, os.O_WRONLY)
        try:
            os.pwrite(fd, data[half:], half)
            os.fsync(fd)
        finally:
            os.close(fd)
        _write_flag(_flag(ctx, self.step, "done"))
        read = [r for r in readers if os.path.exists(_flag(ctx, self.step, f"read.{r}"))]
        by = f"rank(s) {', '.join(map(str, read))} read it torn" if read else "no reader read it torn"
        how = (
            "every reader had moved on" if released else f"the {HANDSHAKE_LIMIT:g} s handshake limit"
        ) + f" ({by}), then wrote the rest"
        name = os.path.basename(path)
        where = f"{name} with {half} of {len(data)} bytes on disk ({path})"
        ctx.record_fired(
            self.fault, f"held the writer of {where} until {how}", effect="checkpoint", file=path, step=self.step
        )

    def close(self) -> None:
        """The writer is past the fault's step: a reader still waiting for its checkpoint waits no longer."""
        _write_flag(_flag(self.ctx, self.step, f"left.{self.ctx.rank}"))


class _Reader:
    """An armed ``TornCheckpointWrite`` on a reader: its reads at the fault's step wait for the writer's checkpoint,
    and it tells the writer when it moved on from the torn file. It stays armed past its step until the writer is
    done with its file."""

    def __init__(self, ctx, fault: TornCheckpointWrite):
        self.ctx, self.fault, self.step = ctx, fault, ctx.current_step
        self.reading: str | None = None  # the torn file it opened (until it moves on)
        self.left = False
        self.lock = threading.RLock()

    def note(self, event: dict) -> None:
        """A file event of the reader's job: a read waits for the writer; any other file moves it on."""
        with self.lock:
            if self.left:
                return
            if self.reading is not None:
                if not (event["how"] == "read" and event["path"] == self.reading):  # reading it again is still reading
                    self.close()
                return
            if event["how"] != "read":
                return
            torn = self._torn()
            if torn is None or torn["path"] != event["path"] or os.path.exists(_flag(self.ctx, self.step, "done")):
                return
            self.reading = event["path"]
            _write_flag(_flag(self.ctx, self.step, f"read.{self.ctx.rank}"))
            name, size = os.path.basename(event["path"]), os.stat(event["path"]).st_size  # on disk as it opens it
            how = f"read {name} with {size} of {torn['size']} bytes on disk ({event['path']}) while the writer held it"
            self.ctx.record_fired(self.fault, how, effect="checkpoint", file=event["path"])

    def counted(self, count: int) -> None:
        """The publisher read the reader's count (published: nothing more to do)."""

    def _torn(self) -> dict | None:
        """Wait until the writer holds its checkpoint torn (returned: its path and whole size) or is known elsewhere
        (None): past its step, or blocked in a collective this reader has not reached."""
        ctx, writer = self.ctx, self.fault.writer
        mid, left = _flag(ctx, self.step, "mid"), _flag(ctx, self.step, f"left.{writer}")
        _wait_for(lambda: os.path.exists(mid) or os.path.exists(left) or _calls(ctx, writer) > _count(ctx))
        try:
            with open(mid) as f:
                return json.loads(f.read())
        except FileNotFoundError:
            return None

    def finished(self) -> bool:
        """True once the writer is done with its torn file, or past its step without one: the reader disarms."""
        done, left = _flag(self.ctx, self.step, "done"), _flag(self.ctx, self.step, f"left.{self.fault.writer}")
        return os.path.exists(done) or os.path.exists(left)

    def close(self) -> None:
        """The reader moved on from the torn file, or is done."""
        if not self.left:
            self.left = True
            _write_flag(_flag(self.ctx, self.step, f"left.{self.ctx.rank}"))


class _Publisher(threading.Thread):
    """Publishes an armed rank's count of collectives (:func:`_count`) as it changes, and tells its window, while its
    main thread may wait in a collective (polled: a group's count tells no one)."""

    def __init__(self, window):
        super().__init__(name="ddpfaults-checkpoint-count", daemon=True)
        self.window, self.stopped = window, threading.Event()

    def run(self) -> None:
        ctx, published = self.window.ctx, None
        while not self.stopped.is_set():
            count = _count(ctx)
            self.window.counted(count)  # before the count is out: a reader seeing it must find the file torn already
            if count != published:
                _write_flag(_flag(ctx, None, f"calls.{ctx.rank}"), str(count))
                published = count
            self.stopped.wait(0.002)


_window: _Window | _Reader | None = None
_publisher: _Publisher | None = None


def _arm(ctx, watcher) -> None:
    global _window, _publisher
    window_ends(closing=True)
    _window = watcher
    files.listen(ctx, watcher.note, first=True)  # it acts before a rename happens: no one else notes it first
    issued = _issued()
    _base[ctx], _sent[ctx] = issued or 0, 0
    if issued is not None:
        _publisher = _Publisher(watcher)
        _publisher.start()


def kill_mid_file(ctx, fault: WriterKilledMidSave) -> None:
    """Arm ``fault`` on its writer as a step it applies to starts: watch the files its job writes (not yet an effect:
    it fires when a file is cut and the writer killed; a step that writes none leaves it unfired)."""
    if ctx.rank == fault.writer:
        _arm(ctx, _Window(ctx, fault))


def tear_mid_file(ctx, fault: TornCheckpointWrite) -> None:
    """Arm ``fault`` as a step it applies to starts: the writer watches the files it writes, a reader its reads (not
    yet an effect: it fires when the writer holds a file torn, and on a reader that reads it so)."""
    _arm(ctx, _TornWindow(ctx, fault) if ctx.rank == fault.writer else _Reader(ctx, fault))


def entering(ctx, op: str, counted: bool = True) -> None:
    """``ctx``'s rank enters collective ``op`` at a step a checkpoint fault applies to: the file its writer was
    writing is complete (acted on there, before the rank's count moves); ``counted`` (not a send): the rank
    publishes its count."""
    window_ends(ctx)
    counts = _entered if counted else _sent
    counts[ctx] = counts.get(ctx, 0) + 1
    if counted:
        _write_flag(_flag(ctx, None, f"calls.{ctx.rank}"), str(_count(ctx)))


def window_ends(ctx=None, closing: bool = False) -> None:
    """The rank moved on: the file a writer was writing is complete (acted on there). ``ctx`` given (it enters a
    collective): only the armed job's, and the window stays open; else (its next step starts, its job ends) the
    window closes, a reader's only once the writer is done with its file, unless ``closing`` (its job ends)."""
    global _window, _publisher
    window = _window
    if window is None or (ctx is not None and window.ctx is not ctx):
        return
    if isinstance(window, _Window):
        window.complete()
    if ctx is None and (closing or window.finished()):
        files.unlisten(window.ctx, window.note)
        if _publisher is not None:
            _publisher.stopped.set()
            _publisher.join()
            _publisher = None
        _window = None
        window.close()


def reads_after_restart(ctx) -> None:
    """A job of an attempt after one whose plan held a checkpoint fault: record each file it reads in its timeline
    (the judge names the writer of a file cut before the restart that the ranks then failed reading)."""
    if any(isinstance(f, (TornCheckpointWrite, WriterKilledMidSave)) and f.attempt < ctx.attempt for f in ctx.faults):
        files.listen(ctx, functools.partial(_read, ctx))


def _read(ctx, event: dict) -> None:
    if event["how"] == "read":
        ctx.record_read(event)


def _cut(path: str, size: int) -> None:
    """Truncate ``path`` to ``size`` bytes, durably."""
    fd = os.open(path, os.O_WRONLY)
    try:
        os.ftruncate(fd, size)
        os.fsync(fd)
    finally:
        os.close(fd)


def _flag(ctx, step: int | None, name: str) -> str:
    """Path of handshake flag ``name`` (of ``step``'s handshake; None: of every torn step) in the world's shared
    directory, for this attempt."""
    directory = os.path.join(ctx.shared_dir, ".ddpfaults-checkpoint")
    os.makedirs(directory, exist_ok=True)
    return os.path.join(directory, f"{ctx.attempt}.{'' if step is None else f'{step}.'}{name}")


def _write_flag(path: str, text: str = "") -> None:
    """Write a flag file atomically (readers see it whole or not at all; a rank's threads each through a file of
    its own)."""
    temporary = f"{path}.{threading.get_ident()}.tmp"
    with open(temporary, "w") as f:
        f.write(text)
    os.replace(temporary, path)


def _issued() -> int | None:
    """How many calls (collectives, sends and receives) this process's process groups have issued, as each counts
    them (gloo's sequence number, moved as a call is issued: a rank waiting in one has it counted); None where a
    group keeps no count."""
    try:
        return sum(group._get_sequence_number_for_group() for group in list(torch_private.groups().pg_names))
    except (AttributeError, RuntimeError):
        return None


def _count(ctx) -> int:
    """How many collectives and receives ``ctx``'s rank has entered since its window was armed, sends left out (a
    held writer's sends to its readers must not put it ahead of their receives): its groups' count less the sends
    ddpfaults traced; where a group keeps none, the collectives it traced at torn steps."""
    issued = _issued()
    return _entered.get(ctx, 0) if issued is None else issued - _base.get(ctx, 0) - _sent.get(ctx, 0)


def _calls(ctx, rank: int) -> int:
    """How many collectives ``rank`` has entered, sends left out (as it published)."""
    try:
        with open(_flag(ctx, None, f"calls.{rank}")) as f:
            return int(f.read() or 0)
    except FileNotFoundError:
        return 0


def _moved_on(ctx, step: int, reader: int, past: int) -> bool:
    """True if ``reader`` moved on from ``step``'s torn file (or is done), or has entered ``past`` collectives: one
    the held writer has not left."""
    return os.path.exists(_flag(ctx, step, f"left.{reader}")) or _calls(ctx, reader) >= past


def _wait_for(condition) -> bool:
    """Poll ``condition`` (a handshake, not a timing guess); False only after :data:`HANDSHAKE_LIMIT`."""
    deadline = time.monotonic() + HANDSHAKE_LIMIT
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.002)
    return True
