"""Find processes a world left behind: its ranks, anything in their process groups, and everything below them.

What a rank starts can leave its process group and session (a child in a session of its own, a daemon's double
fork). It stays below the rank, which is a child subreaper (see :mod:`ddpfaults.proc.tree`); and once the rank is
gone, below the fork server, which is one too (:mod:`ddpfaults.rank.forkserver`): a child of the fork server that
is no process this launcher started is such an orphan. The fork server is shared by every world of this process,
so an orphan cannot be told apart by world: it counts (and is killed) with any world closed after it appeared.
"""

from __future__ import annotations

import multiprocessing
import os

import psutil

from ddpfaults.proc import mp_private, tree

#: pid of every rank process started by this launcher process (each is also its process group id)
LAUNCHED: list[int] = []
#: ranks deliberately kept alive in a warm world (see ddpfaults.engine.pool); not counted as survivors
POOLED: set[int] = set()


def _cmdline(pid: int) -> str:
    try:
        return " ".join(psutil.Process(pid).cmdline())
    except psutil.Error:
        return "?"


def survivors(pids=None) -> list[tuple[int, str]]:
    """Live (non-zombie) processes that are one of the ranks ``pids``, in a process group led by one of them, or
    below one of them; and the orphans the fork server adopted (with everything below them).

    ``pids`` defaults to every rank this process ever launched, less the warm ones kept in the
    pool. Returns (pid, command line) pairs.
    """
    ranks = set(LAUNCHED) - POOLED if pids is None else set(pids)
    table = tree.snapshot()
    server = mp_private.fork_server_pid()
    parents = {os.getpid(), server}
    # a rank's pid once it is gone may be any process's by now: only a child of ours is that rank
    roots = {p.pid for p in table.values() if p.pid in ranks and p.ppid in parents}
    if server in table and table[server].ppid == os.getpid():
        started = {p.pid for p in multiprocessing.active_children()}
        roots |= {p.pid for p in table.values() if p.ppid == server and p.pid not in started}
    # a process group named by a rank's pid is that rank's while its leader is that rank, or gone (a rank that was
    # killed leaves its children in it); a live leader that is no rank of ours took the number over when it was free
    # (pids are recycled: 32768 go round in minutes of worlds): that group is another process's, its members too
    ours = {pgid for pgid in ranks if pgid in roots or pgid not in table}
    found = roots | tree.below(roots, table) | {p.pid for p in table.values() if p.pgid in ours}
    return [(pid, _cmdline(pid)) for pid in sorted(found) if table[pid].live]
