"""Carrying out ``OutOfMemory`` inside a rank: lower the address-space limit, probe it, lift it again.

The limit (``RLIMIT_AS``, soft) is set to the rank's current address space plus a margin, so the next allocation
larger than the margin fails the way it does on a machine out of memory: torch's CPU allocator raises
``RuntimeError: ... DefaultCPUAllocator: can't allocate memory ... Error code 12``, numpy ``MemoryError``.
It is lifted when the rank's next step starts and when its job ends (a warm rank runs the next job unlimited).
"""

from __future__ import annotations

import mmap
import resource

import psutil

_saved: tuple[int, int] | None = None  # the limit in force before ours, while ours is


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
    """Lift the limit :func:`limit` set, if one is in force (idempotent)."""
    global _saved
    if _saved is not None:
        resource.setrlimit(resource.RLIMIT_AS, _saved)
        _saved = None
