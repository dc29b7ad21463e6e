"""How many ranks this machine can hold: a larger local world is refused before any process starts.

Each rank costs memory, kernel tasks (its threads) and, in the launcher, file descriptors; the limit is the
smallest of the three budgets, each what is free now divided by the measured cost per rank (torch 2.13 CPU,
gloo, a fork-server rank):

- memory: ``MemAvailable`` / :data:`RANK_MEMORY`. An idle rank adds about 12 MiB (torch's pages are shared
  with the fork server); 64 MiB leaves room for a small model, a DataLoader and gloo's buffers;
- tasks: the kernel's free task slots (``min(pid_max, threads-max)`` less the tasks running, and the
  per-user ``RLIMIT_NPROC``) / :data:`RANK_TASKS` (6 threads measured per rank);
- descriptors: the launcher's free ``RLIMIT_NOFILE`` / :data:`LAUNCHER_FDS` (3 measured per rank: its pipe,
  its sentinel, its event file).
"""

from __future__ import annotations

import resource

import psutil

from ddpfaults import errors

RANK_MEMORY = 64 * 2**20
RANK_TASKS = 8
LAUNCHER_FDS = 4


def _mem_available() -> int | None:
    return psutil.virtual_memory().available


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _free_tasks() -> int | None:
    limits = [v for v in (_read_int("/proc/sys/kernel/pid_max"), _read_int("/proc/sys/kernel/threads-max")) if v]
    try:
        with open("/proc/loadavg") as f:
            running = int(f.read().split()[3].split("/")[1])  # "runnable/total" kernel scheduling entities
    except (OSError, ValueError, IndexError):
        return None
    free = min(limits) - running if limits else None
    nproc = resource.getrlimit(resource.RLIMIT_NPROC)[0]
    if nproc != resource.RLIM_INFINITY:
        free = min(free, nproc - running) if free is not None else nproc - running
    return free


def _free_fds() -> int | None:
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY:
        return None
    return soft - psutil.Process().num_fds()


def budgets(mem_available=None, free_tasks=None, free_fds=None) -> dict[str, tuple[int, str]]:
    """Each budget as ``name: (ranks, how it is derived)``, from this machine unless given (bytes, tasks, fds);
    a resource that cannot be read is left out."""
    mem_available = _mem_available() if mem_available is None else mem_available
    free_tasks = _free_tasks() if free_tasks is None else free_tasks
    free_fds = _free_fds() if free_fds is None else free_fds
    found = {}
    if mem_available is not None:
        found["memory"] = (
            mem_available // RANK_MEMORY,
            f"{mem_available / 2**30:.1f} GiB available / {RANK_MEMORY // 2**20} MiB per rank",
        )
    if free_tasks is not None:
        found["tasks"] = (free_tasks // RANK_TASKS, f"{free_tasks} free kernel tasks / {RANK_TASKS} per rank")
    if free_fds is not None:
        found["file descriptors"] = (
            free_fds // LAUNCHER_FDS,
            f"{free_fds} free file descriptors / {LAUNCHER_FDS} per rank in the launcher",
        )
    return found


def check_world_size(world_size: int, **measured) -> None:
    """Raise :class:`~ddpfaults.errors.InvalidWorldSize` if ``world_size`` ranks exceed a budget of this machine."""
    found = budgets(**measured)
    if not found:
        return
    limit = min(ranks for ranks, _ in found.values())
    if world_size > limit:
        how = "; ".join(f"{name}: {text} = {ranks}" for name, (ranks, text) in found.items())
        raise errors.InvalidWorldSize(
            f"world_size={world_size} is more than this machine can hold: at most {limit} ranks here ({how})"
        )
