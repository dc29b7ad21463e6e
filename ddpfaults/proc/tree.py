"""The process tree, read from /proc: who descends from whom, and killing everything below a process.

A rank's descendants may leave its process group and session (``subprocess.Popen(start_new_session=True)``,
a daemon's ``fork``/``setsid``/``fork``), so killing the rank's group does not reach them. Ancestry does, as
long as an orphan re-parents to a process of ours rather than to init: a rank marks itself a *child
subreaper* (``PR_SET_CHILD_SUBREAPER``), so whatever its descendants start stays below it while it lives,
and the fork server does the same for the descendants of ranks that died (:mod:`ddpfaults.rank.forkserver`).

Used inside ranks, in the fork server and by the launcher's census; imports nothing of ddpfaults.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36


@dataclass(frozen=True)
class Proc:
    """One process as /proc/PID/stat shows it."""

    pid: int
    state: str  # R, S, D, Z (zombie), X (dead), ...
    ppid: int
    pgid: int
    sid: int

    @property
    def live(self) -> bool:
        """Running (a zombie has exited: only its exit status is left for its parent to collect)."""
        return self.state not in ("Z", "X")


def read(pid: int) -> Proc | None:
    """The process ``pid``, None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return Proc(pid, fields[0].decode(), int(fields[1]), int(fields[2]), int(fields[3]))
    except (OSError, IndexError, ValueError):
        return None


def runnable(pid: int | None, samples: int = 1, interval: float = 0.005) -> bool:
    """True if the process's main thread was running or waiting for a CPU (state ``R``) in any of ``samples``
    looks: computing, however little CPU it gets (a rank waiting on its peers sleeps, ``S``)."""
    for n in range(samples):
        proc = read(pid) if pid is not None else None
        if proc is None:
            return False
        if proc.state == "R":
            return True
        if n + 1 < samples:
            time.sleep(interval)
    return False


def threads_runnable(pid: int | None) -> bool | None:
    """True if any thread of the process is running or waiting for a CPU (state ``R``) right now; None if the
    process is gone. A thread that sleeps while others of its process compute (an intra-op thread pool) is not
    waiting on the process's peers: this looks at them all."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task") if pid is not None else None
    except OSError:
        return None
    if tasks is None:
        return None
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/stat", "rb") as f:
                if f.read().rsplit(b")", 1)[1].split()[0] == b"R":
                    return True
        except (OSError, IndexError):
            continue
    return False


def snapshot() -> dict[int, Proc]:
    """Every process on the machine, by pid."""
    table = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            proc = read(int(entry))
            if proc is not None:
                table[proc.pid] = proc
    return table


def below(roots, table: dict[int, Proc]) -> set[int]:
    """The pids of every process descending from one of ``roots`` (children, their children...), roots excluded."""
    children: dict[int, list[int]] = {}
    for proc in table.values():
        children.setdefault(proc.ppid, []).append(proc.pid)
    found: set[int] = set()
    todo = list(roots)
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def prctl(option: int, value: int) -> bool:
    """Linux ``prctl(option, value)``; False where it is not available."""
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def become_subreaper() -> bool:
    """Make orphaned descendants of this process re-parent to it instead of init (not inherited by children)."""
    return prctl(PR_SET_CHILD_SUBREAPER, 1)


def kill(pids) -> None:
    """SIGKILL each of ``pids`` that still exists."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def kill_below(pid: int, timeout: float = 5.0) -> list[int]:
    """SIGKILL every live descendant of ``pid`` until none is left (or ``timeout`` s passed); returns those left.

    Each round kills a whole snapshot: a process forked after it re-parents (its parent killed) to the
    nearest subreaper above, ``pid`` itself if it is one, and the next round finds it.
    """
    deadline = time.monotonic() + timeout
    while True:
        table = snapshot()
        left = sorted(p for p in below([pid], table) if table[p].live)
        if not left or time.monotonic() > deadline:
            return left
        kill(left)
        time.sleep(0.005)
