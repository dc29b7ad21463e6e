"""The fork server's part in teardown: imported first by the fork server (``ddpfaults.engine.pool`` preloads it),
it acts only there.

Ranks started with the forkserver method are children of multiprocessing's fork server, not of the launcher.
Two things let a rank's descendants outlive the launcher, and the fork server and resource tracker with them:

- A descendant that left the rank's session (``Popen(start_new_session=True)``, a daemon's double fork) is not
  killed with the rank's process group, and once its parents are gone it re-parents to init, where nothing of
  ours can tell it from any other process.
- The fork server runs until its "alive" pipe reads EOF (``multiprocessing.forkserver.main``), that is until
  every write end is closed. The launcher holds one, and the fork server hands one to every rank it forks
  (``_forkserver_alive_fd``, in ``_serve_one``), together with the write end of the resource tracker's pipe
  (``resource_tracker._resource_tracker._fd``); the tracker likewise runs until its pipe reads EOF. ``os.fork``
  copies every fd, so a daemon a rank forks holds both write ends: while it lives, the fork server (torch
  imported: ~300 MB) and the tracker stay up after the launcher is gone. (``subprocess`` closes inherited fds
  in the programs it runs, so a ``Popen`` child holds neither.)

So here the fork server (1) becomes the child subreaper of everything below it: descendants of a rank that died
re-parent to it rather than to init, the launcher's census finds them as its children that are no process the
launcher started (``ddpfaults.engine.census``), and its own SIGCHLD loop reaps them; and (2) asks the kernel for
:data:`SIGNAL` when the launcher dies (even by SIGKILL, which runs no clean-up in the launcher): it gives the
ranks a moment to clean up after themselves (they watch the launcher too, see ``ddpfaults.rank.main``), kills
everything still below it and exits, which closes the last write ends of both pipes.
"""

from __future__ import annotations

import atexit
import glob
import math
import os
import shutil
import signal
import sys
import tempfile
import time
import warnings

from ddpfaults.proc import mp_private, tree

#: what the kernel sends the fork server when the launcher dies (PR_SET_PDEATHSIG)
SIGNAL = signal.SIGUSR2
#: seconds the ranks get to remove their world's directory before the fork server kills them
GRACE = 2.0

_server_pid: int | None = None
_launcher_pid: int | None = None


def in_fork_server() -> bool:
    """Whether this import runs from multiprocessing's fork server's ``main`` (its preload step)."""
    return mp_private.in_fork_server_main(sys._getframe(1))


def probe() -> None:
    """The fork server's first child (``ddpfaults.engine.pool.fork_server_ready``): it exits at once. A function of
    a module the fork server preloads, so it pickles by name whatever has replaced ``os._exit`` (coverage.py's
    ``patch = _exit`` makes that a local function, which cannot be pickled: the probe then failed to start)."""
    os._exit(0)


def _install() -> None:
    global _server_pid, _launcher_pid
    _server_pid, _launcher_pid = os.getpid(), os.getppid()
    tree.become_subreaper()
    atexit.register(_reap_below)  # its "alive" pipe closed: it exits, after the ranks it forked
    # its SIGCHLD loop reaps the orphans it adopts too, and warns about each pid it did not fork
    warnings.filterwarnings("ignore", message="forkserver: waitpid returned unexpected pid")
    signal.signal(SIGNAL, _on_parent_death)
    tree.prctl(tree.PR_SET_PDEATHSIG, SIGNAL)  # a launcher gone before this line: the alive pipe ends the server


def _reap_below() -> None:
    """The fork server's exit: reap every child it has (the ranks it forked, the orphans it adopted), killing what
    still runs after :data:`GRACE`, so none is left a zombie of init once the server is gone."""
    if os.getpid() != _server_pid:
        return  # a rank forked from the server inherits the registration
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the server's handler writes to a pipe its loop has left
    deadline = time.monotonic() + GRACE
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid:
            continue
        if time.monotonic() > deadline:
            tree.kill(tree.below([os.getpid()], tree.snapshot()))
            deadline = math.inf
        time.sleep(0.005)


def leave() -> None:
    """In a process the fork server forked: drop the handler it installed for itself."""
    if _server_pid is not None and os.getpid() != _server_pid:
        signal.signal(SIGNAL, signal.SIG_DFL)


def _on_parent_death(signum, frame) -> None:
    if os.getpid() != _server_pid:  # a process forked from the server that has not called leave(): the default
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    if os.getppid() == _launcher_pid:  # only the launcher's thread that started the server ended
        return
    deadline = time.monotonic() + GRACE
    while time.monotonic() < deadline and _ranks_alive():
        time.sleep(0.02)
    tree.kill_below(os.getpid())
    _remove_socket_dir()
    _remove_world_dirs()
    os._exit(0)


def _ranks_alive() -> bool:
    """Whether a child still leads a session of its own, as each rank does (``os.setsid`` in its main)."""
    table = tree.snapshot()
    return any(p.ppid == _server_pid and p.sid == p.pid and p.live for p in table.values())


def world_dir_prefix(launcher_pid: int) -> str:
    """The name every world directory of the launcher ``launcher_pid`` starts with (in the temp dir)."""
    return f"ddpfaults-world-{launcher_pid}-"


def _remove_world_dirs() -> None:
    """Remove the launcher's world directories that its ranks left (a rank removes its world's as it sees the
    launcher gone, but a peer still running may write into it after that)."""
    pattern = os.path.join(tempfile.gettempdir(), glob.escape(world_dir_prefix(_launcher_pid)) + "*")
    for directory in glob.glob(pattern):
        shutil.rmtree(directory, ignore_errors=True)


def _remove_socket_dir() -> None:
    """Remove the launcher's multiprocessing temp dir (``pymp-*``, holding this server's socket): the launcher's
    exit would have, had it run its clean-up."""
    address = mp_private.fork_server_address()
    if isinstance(address, str) and os.path.basename(os.path.dirname(address)).startswith("pymp-"):
        shutil.rmtree(os.path.dirname(address), ignore_errors=True)


if in_fork_server():
    _install()
