"""Carrying out ``OutOfMemory`` inside a rank: lower the address-space limit, probe it, lift it again.

The limit (``RLIMIT_AS``, soft) is set to the rank's current address space plus a margin, so the next allocation
larger than the margin fails the way it does on a machine out of memory: torch's CPU allocator raises
``RuntimeError: ... DefaultCPUAllocator: can't allocate memory ... Error code 12``, numpy ``MemoryError``.
It is lifted when the rank's next step starts and when its job ends (a warm rank runs the next job unlimited).

While it is in force, :func:`watch` sees every exception the rank's main thread raises or meets (a tracer for
exception events only): the first that says the host is out of memory is the limit taking effect, whether the code
catches it or not. A limit that no allocation reaches changes nothing, and is never taken for an effect.
"""

from __future__ import annotations

import errno
import mmap
import resource
import sys

import psutil

_saved: tuple[int, int] | None = None  # the limit in force before ours, while ours is
_watching: tuple | None = None  # (callback, the trace function in force before ours) while a watch is on


def is_out_of_memory(exc: BaseException) -> bool:
    """True for the errors a host out of memory raises: Python's and numpy's ``MemoryError``, torch's CPU allocator
    (``RuntimeError`` "can't allocate memory"), an ``OSError`` ENOMEM (mmap)."""
    if isinstance(exc, MemoryError):
        return True
    if isinstance(exc, OSError):
        return exc.errno == errno.ENOMEM
    return isinstance(exc, RuntimeError) and "can't allocate memory" in str(exc)


def _local(frame, event, arg):
    if event == "exception" and _watching is not None and is_out_of_memory(arg[1]):
        callback = _watching[0]
        _unwatch()
        callback(f"{type(arg[1]).__name__}: {str(arg[1]).strip().splitlines()[0] if str(arg[1]).strip() else ''}")
        return None
    return _local


def _global(frame, event, arg):
    frame.f_trace_lines = False
    return _local


def watch(callback) -> None:
    """Until :func:`restore`, call ``callback(error text)`` once, at the first out-of-memory error the main thread
    raises or meets (in a frame running now or started later)."""
    global _watching
    _unwatch()
    _watching = (callback, sys.gettrace())
    frame = sys._getframe(1)
    while frame is not None:
        frame.f_trace_lines = False
        frame.f_trace = _local
        frame = frame.f_back
    sys.settrace(_global)


def _unwatch() -> None:
    global _watching
    if _watching is not None:
        previous, _watching = _watching[1], None
        sys.settrace(previous)


def address_space() -> int:
    """This process's virtual address space in bytes (``VmSize``)."""
    return psutil.Process().memory_info().vms


def limit(margin: int) -> str | None:
    """Limit this process to its current address space + ``margin`` bytes; what was done, or None (then nothing is
    left limited) if the limit could not be set or an allocation of twice the margin still succeeds under it."""
    global _saved
    restore()
    try:
        used = address_space()
        previous = resource.getrlimit(resource.RLIMIT_AS)
        resource.setrlimit(resource.RLIMIT_AS, (used + margin, previous[1]))
    except (OSError, ValueError):
        return None
    _saved = previous
    try:
        probe = mmap.mmap(-1, 2 * margin)
    except OSError:
        return f"limited the address space to {(used + margin) / 2**20:.0f} MiB ({margin / 2**20:.0f} MiB above use)"
    probe.close()
    restore()
    return None


def restore() -> None:
    """Lift the limit :func:`limit` set, if one is in force, and end the :func:`watch` (idempotent)."""
    global _saved
    _unwatch()
    if _saved is not None:
        resource.setrlimit(resource.RLIMIT_AS, _saved)
        _saved = None
