"""Find processes a world left behind: its ranks and anything in their process groups."""

from __future__ import annotations

import os

#: pid of every rank process started by this launcher process (each is also its process group id)
LAUNCHED: list[int] = []
#: ranks deliberately kept alive in a warm world (see ddpfaults.engine.pool); not counted as survivors
POOLED: set[int] = set()


def _stat(pid: int) -> tuple[str, int] | None:
    """(state letter, process group id) of a live process, None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[0].decode(), int(fields[2])


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


def survivors(pids=None) -> list[tuple[int, str]]:
    """Live (non-zombie) processes that are one of ``pids`` or in a process group led by one of them.

    ``pids`` defaults to every rank this process ever launched, less the warm ones kept in the
    pool. Returns (pid, command line) pairs.
    """
    groups = set(LAUNCHED) - POOLED if pids is None else set(pids)
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        info = _stat(int(entry))
        if info is None or info[0] in ("Z", "X"):
            continue
        if int(entry) in groups or info[1] in groups:
            found.append((int(entry), _cmdline(int(entry))))
    return found
