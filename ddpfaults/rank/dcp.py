"""Distributed Checkpoint inside a rank: its saves, and its faults (:mod:`ddpfaults.faults.dcp`).

- :func:`track_saves` wraps ``dcp.save`` and ``dcp.async_save`` once per rank process, from its start (at once if
  DCP is imported, else as it is imported: it costs 0.6 s and is never imported here), so every completed save is
  reported (a preempted job's checkpoint) and ``AsyncSaveKilled`` acts as an ``async_save`` returns;
- :func:`install` wraps ``os.fsync`` (a shard written), ``os.rename`` (``.metadata`` moved into place), the existence
  checks of ``os.path`` and ``os.listdir`` once per rank process, when a step a DCP fault applies to starts.

Outside a job, or where no such fault applies, each wrapper only calls through.
"""

from __future__ import annotations

import functools
import os
import posixpath
import signal
import sys
import time
from collections.abc import Callable

from ddpfaults.faults.dcp import AsyncSaveKilled, CheckpointNotVisible, TornDcpWrite
from ddpfaults.rank import running
from ddpfaults.rank.on_import import patch_on_import

_installed = False
#: the os.path checks a lagging view answers (for a path in a checkpoint directory: False)
_CHECKS = ("exists", "isdir", "isfile", "lexists")


def install() -> None:
    """Wrap ``os.fsync``, ``os.rename``, ``os.path``'s existence checks and ``os.listdir`` (once per process)."""
    global _installed
    if _installed:
        return
    _installed = True
    os.fsync = _fsync(os.fsync)
    os.rename = _rename(os.rename)
    for name in _CHECKS:
        setattr(posixpath, name, _check(getattr(posixpath, name)))
    os.listdir = _listdir(os.listdir)


_SAVER = "torch.distributed.checkpoint.state_dict_saver"
_saved: Callable | None = None  # what a completed save calls: saved(ctx, step, checkpoint, began)


def track_saves(saved: Callable) -> None:
    """Make ``dcp.save`` and ``dcp.async_save`` call ``saved(ctx, step, checkpoint, began)`` when a save of the running
    job completes (``step``: the job's step when it began; ``checkpoint``: its directory's name, or None; ``began``:
    when it began, ``time.monotonic()``), and act for
    ``AsyncSaveKilled``. Once per process: now if DCP is imported, else as it is (so that ``from
    torch.distributed.checkpoint import save`` binds the wrapped function too)."""
    global _saved
    if _saved is not None:
        return
    _saved = saved
    patch_on_import(_SAVER, _wrap_saver)


def _wrap_saver(saver) -> None:
    """Wrap the saver module's ``save`` and ``async_save``, and its package's names for them if already bound."""
    package = sys.modules.get(saver.__name__.rpartition(".")[0])
    for name, wrap in (("save", _save), ("async_save", _async_save)):
        original = getattr(saver, name)
        wrapped = wrap(original)
        setattr(saver, name, wrapped)
        if getattr(package, name, None) is original:
            setattr(package, name, wrapped)


def _checkpoint_name(args, kwargs) -> str | None:
    """The directory name a DCP save writes to (``checkpoint_id``, else its storage writer's path)."""
    where = kwargs.get("checkpoint_id") or getattr(kwargs.get("storage_writer"), "path", None)
    try:
        return os.path.basename(os.path.normpath(os.fspath(where))) if where is not None else None
    except TypeError:
        return None


def _save(original):
    @functools.wraps(original)
    def save(*args, **kwargs):
        ctx = running.current()
        if sys._getframe(1).f_globals.get("__name__", "").startswith("torch.distributed.checkpoint."):
            ctx = None  # DCP's own call (an async_save's upload thread): reported when the upload's future is done
        step, began = (ctx.current_step if ctx is not None else None), time.monotonic()
        done = original(*args, **kwargs)
        if ctx is not None and running.current() is ctx:
            _saved(ctx, step, _checkpoint_name(args, kwargs), began)
        return done

    return save


def _applying(kind: type):
    """The current rank's context and the first fault of ``kind`` applying to it at its step, or (ctx, None)."""
    ctx = running.current()
    if ctx is None:
        return None, None
    return ctx, next((f for f in ctx._active() if isinstance(f, kind)), None)


def _tear(path: str, truncate) -> None:
    """Tear the file at ``path`` if a :class:`TornDcpWrite` applying now wants it (``truncate(length)`` cuts it)."""
    ctx, fault = _applying(TornDcpWrite)
    if fault is None or not fault.wants(os.path.basename(path)) or not ctx.once(fault):
        return
    size = os.stat(path).st_size
    truncate(size // 2)
    name = os.path.basename(path)
    if fault.killed:
        how = f"SIGKILLed the writer mid-write of {name} ({size // 2} of {size} bytes)"
        ctx.record_fired(fault, how, effect="checkpoint", signal="SIGKILL")
        os.kill(os.getpid(), signal.SIGKILL)
    ctx.record_fired(fault, f"tore {name} to {size // 2} of {size} bytes", effect="checkpoint")


def _fsync(original):
    @functools.wraps(original)
    def fsync(fd):
        if _applying(TornDcpWrite)[1] is not None:  # a shard: DCP flushes it before its fsync
            try:
                path = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:
                path = ""
            if path.endswith(".distcp"):
                _tear(path, lambda length: os.ftruncate(fd, length))
        return original(fd)

    return fsync


def _rename(original):
    @functools.wraps(original)
    def rename(src, dst, *args, **kwargs):
        if _applying(TornDcpWrite)[1] is not None:  # .metadata: pickled into a buffered file, then renamed in place
            path = os.fspath(src)
            if isinstance(path, str) and os.path.basename(path).startswith(".metadata"):
                _tear(path, lambda length: os.truncate(path, length))
        return original(src, dst, *args, **kwargs)

    return rename


def _checkpoint_path(path) -> str | None:
    """The DCP checkpoint directory ``path`` is or lies in (a directory holding ``.metadata``), else None."""
    try:
        path = os.path.abspath(os.fspath(path))
    except TypeError:
        return None
    if isinstance(path, bytes):
        return None
    for place in (path, os.path.dirname(path)):
        if _ORIGINAL["isfile"](os.path.join(place, ".metadata")):
            return place
    return None


_ORIGINAL: dict = {}


def _hidden(path) -> bool:
    """True if ``path`` is in a checkpoint the current rank's lagging view hides (recorded once per step)."""
    ctx, fault = _applying(CheckpointNotVisible)
    if fault is None:
        return False
    place = _checkpoint_path(path)
    if place is None:
        return False
    if ctx.once(fault):
        ctx.record_fired(fault, f"hid checkpoint {os.path.basename(place)} from the rank", effect="checkpoint")
    return True


def _check(original):
    _ORIGINAL[original.__name__] = original

    @functools.wraps(original)
    def check(path):
        return False if _hidden(path) else original(path)

    return check


def _listdir(original):
    @functools.wraps(original)
    def listdir(path="."):
        names = original(path)
        if _applying(CheckpointNotVisible)[1] is None or not isinstance(path, (str, os.PathLike)):
            return names
        return [n for n in names if not _hidden(os.path.join(path, n))]

    return listdir


def _async_save(original):
    @functools.wraps(original)
    def async_save(*args, **kwargs):
        began = time.monotonic()
        future = original(*args, **kwargs)
        upload = getattr(future, "upload_completion", future)  # a Future, or an AsyncSaveResponse holding one
        ctx = running.current()
        if ctx is not None:
            step, name = ctx.current_step, _checkpoint_name(args, kwargs)

            def uploaded(done):
                if running.current() is ctx and not done.cancelled() and done.exception() is None:
                    _saved(ctx, step, name, began)

            upload.add_done_callback(uploaded)
        ctx, fault = _applying(AsyncSaveKilled)
        if fault is not None and ctx.once(fault):
            done = "completed" if upload.done() else "pending"
            ctx.record_fired(
                fault,
                f"SIGKILLed the writer as dcp.async_save returned (its future {done})",
                effect="checkpoint",
                signal="SIGKILL",
            )
            os.kill(os.getpid(), signal.SIGKILL)
        return future

    return async_save


def failing_ranks(exc: BaseException | None) -> list[int] | None:
    """The ranks a DCP ``CheckpointException`` (``exc``, or one it was raised from) names as the ones that failed,
    sorted; None for any other exception. Every rank raises the same one, so the first to raise is not the culprit."""
    for _ in range(8):  # a chain of causes, not a cycle
        if exc is None:
            return None
        failures = getattr(exc, "failures", None)
        if type(exc).__name__ == "CheckpointException" and isinstance(failures, dict):
            return sorted(r for r in failures if isinstance(r, int))
        exc = exc.__cause__ or exc.__context__
    return None
