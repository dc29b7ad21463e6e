"""Rank functions whose ranks start a process that leaves the rank's process group: a child in a session of its own
(``subprocess.Popen(start_new_session=True)``) or a daemon (``os.fork``, ``os.setsid``, ``os.fork`` again)."""

import os
import subprocess
import sys
import time

import torch
import torch.distributed as dist

from processes import EVENT_GUARD

_KEEP = []  # the Popen objects: garbage-collecting a running one warns


def _write(path, value):
    with open(path + ".tmp", "w") as f:
        f.write(str(value))
    os.replace(path + ".tmp", path)


def _daemonize(path):
    """Double-fork a daemon (a session of its own, its parent gone) that writes its pid to ``path`` and sleeps."""
    child = os.fork()
    if child == 0:
        try:
            os.setsid()
            if os.fork() == 0:
                _write(path, os.getpid())
                # fixed: stands for "never returns": the test ends it (a signal, a kill, the judge) long before
                time.sleep(600)
        finally:
            os._exit(0)
    os.waitpid(child, 0)
    while not os.path.exists(path):
        # fixed: the poll interval: the event ends the wait, this only spaces the looks
        time.sleep(0.01)


def start_escapee(ctx, directory, how, crash_rank=None, hang=False):
    """Every rank starts a sleeping process of the kind ``how`` ("session" or "daemon"; a list: each rank's) and
    writes its pid to ``directory/escapee{rank}.pid`` (its own to ``rank{rank}.pid``, rank 0 the world's temp dir to
    ``shared_dir``); once every rank has (a barrier), rank ``crash_rank`` raises, or (``hang``) rank 0 skips the
    all_reduce the others wait in."""
    _write(os.path.join(directory, f"rank{ctx.rank}.pid"), os.getpid())
    if ctx.rank == 0:
        _write(os.path.join(directory, "shared_dir"), ctx.shared_dir)
    path = os.path.join(directory, f"escapee{ctx.rank}.pid")
    if isinstance(how, list):
        how = how[ctx.rank]
    if how == "session":
        # fixed: stands for "never returns": the test ends it (a signal, a kill, the judge) long before
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
        _KEEP.append(child)
        _write(path, child.pid)
    else:
        _daemonize(path)
    ctx.step(0)
    dist.barrier()  # both ranks started theirs before either crashes (a crash ends the world at once) or skips
    if ctx.rank == crash_rank:
        raise RuntimeError("a rank that started a process of its own crashed")
    if hang and ctx.rank == 0:
        return "skipped"
    dist.all_reduce(torch.ones(1))
    return "done"


def written_pids(directory, world_size, kind="escapee"):
    """The pids of ``kind`` ("escapee" or "rank") the ranks wrote (those that got that far), in rank order."""
    pids = []
    for r in range(world_size):
        path = os.path.join(directory, f"{kind}{r}.pid")
        if os.path.exists(path):
            with open(path) as f:
                pids.append(int(f.read()))
    return pids


def make_scratch_dir(ctx, directory, kill=False):
    """Make a directory with ``tempfile.mkdtemp`` and leave it there, writing its path to ``directory/scratch{rank}``;
    with ``kill``, rank 1 then dies by SIGKILL (nothing of its own clean-up runs), once rank 0 has made its own
    (else rank 0 may meet the dead peer first, at a collective that starts its job on a warm world)."""
    import signal
    import tempfile
    import time

    scratch = tempfile.mkdtemp(prefix="scratch-")
    _write(os.path.join(directory, f"scratch{ctx.rank}"), scratch)
    ctx.step(0)
    if kill and ctx.rank == 1:
        deadline = time.monotonic() + EVENT_GUARD
        while not os.path.exists(os.path.join(directory, "scratch0")) and time.monotonic() < deadline:
            # fixed: the poll interval: the event ends the wait, this only spaces the looks
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGKILL)
    dist.all_reduce(torch.ones(1))
    return scratch
