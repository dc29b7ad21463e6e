"""The Distributed Checkpoint faults inside a rank (:mod:`ddpfaults.faults.dcp`): what ``os.fsync`` (a shard written),
``os.rename`` (``.metadata`` moved into place), the existence checks of ``os.path``, ``os.listdir`` and
``dcp.async_save`` do while one of them applies.

:func:`install` wraps them once per rank process (when a step such a fault applies to starts); outside a job, or
where no such fault applies, each wrapper only calls through.
"""

from __future__ import annotations

import functools
import os
import posixpath
import signal

from ddpfaults.faults.dcp import AsyncSaveKilled, CheckpointNotVisible, TornDcpWrite
from ddpfaults.rank import running

_installed = False
#: the os.path checks a lagging view answers (for a path in a checkpoint directory: False)
_CHECKS = ("exists", "isdir", "isfile", "lexists")


def install() -> None:
    """Wrap ``os.fsync``, ``os.rename``, ``os.path``'s existence checks, ``os.listdir`` and ``dcp.async_save`` (once
    per process)."""
    global _installed
    if _installed:
        return
    _installed = True
    os.fsync = _fsync(os.fsync)
    os.rename = _rename(os.rename)
    for name in _CHECKS:
        setattr(posixpath, name, _check(getattr(posixpath, name)))
    os.listdir = _listdir(os.listdir)
    import torch.distributed.checkpoint as dcp
    import torch.distributed.checkpoint.state_dict_saver as saver

    traced = _async_save(saver.async_save)
    saver.async_save = dcp.async_save = traced


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
        future = original(*args, **kwargs)
        ctx, fault = _applying(AsyncSaveKilled)
        if fault is not None and ctx.once(fault):
            done = "completed" if future.done() else "pending"
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
