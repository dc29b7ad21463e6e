"""Every use of multiprocessing's private API, in one place: what a Python upgrade may break.

The standard library offers no public way to learn the fork server's pid or socket address, to tell whether code
runs in the fork server's ``main`` (its preload step), or to ask the fork server for a process without having it
re-run the launcher's ``__main__`` first. Used by the launcher (its census and pool) and by the fork server itself
(:mod:`ddpfaults.rank.forkserver`).
"""

from __future__ import annotations

import io
import os
import signal
import sys
import time
from multiprocessing import forkserver, popen_forkserver, reduction, resource_tracker, spawn, util
from multiprocessing.context import set_spawning_popen


def fork_server_pid() -> int | None:
    """The pid of this process's multiprocessing fork server, None if none was started."""
    return getattr(forkserver._forkserver, "_forkserver_pid", None)


def fork_server_address() -> str | None:
    """The fork server's socket path (in the launcher's ``pymp-*`` temp dir), None if none was started."""
    return getattr(forkserver._forkserver, "_forkserver_address", None)


def stop_helpers(grace: float, nudge: int) -> list[int]:
    """Stop multiprocessing's fork server and resource tracker, if this process started them, and reap them: each is
    asked to stop as at the launcher's exit (its "alive" pipe closed) and waited for up to ``grace`` seconds, then
    sent ``nudge`` (the fork server: the signal it takes for the launcher's death, after which it kills what is
    below it), then SIGKILL. Returns the pids reaped. Left to the exit alone, they outlive the launcher by a moment
    and end as zombies of init, where a container whose init does not reap keeps them."""
    reaped = []
    server = forkserver._forkserver
    pid, alive = getattr(server, "_forkserver_pid", None), getattr(server, "_forkserver_alive_fd", None)
    if pid is not None and alive is not None:
        os.close(alive)
        server._forkserver_alive_fd = None
        _reap(pid, grace, nudge)
        server._forkserver_pid = None
        reaped.append(pid)
    tracker = resource_tracker._resource_tracker
    pid, fd = getattr(tracker, "_pid", None), getattr(tracker, "_fd", None)
    if pid is not None and fd is not None:
        os.close(fd)
        tracker._fd = None
        _reap(pid, grace, signal.SIGTERM)
        tracker._pid = None
        reaped.append(pid)
    return reaped


def _reap(pid: int, grace: float, nudge: int) -> None:
    """Wait for child ``pid`` to exit, up to ``grace`` seconds, then send it ``nudge``, then SIGKILL; reap it."""
    for signum in (None, nudge, signal.SIGKILL):
        if signum is not None:
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        while True:
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                return
            if done:
                return
            if time.monotonic() > deadline:
                break
            time.sleep(0.005)


def in_fork_server_main(frame) -> bool:
    """True if ``frame`` runs within multiprocessing's fork server's ``main`` (its preload step)."""
    server = sys.modules.get("multiprocessing.forkserver")
    while server is not None and frame is not None:
        if frame.f_code is server.main.__code__:
            return True
        frame = frame.f_back
    return False


class ProbePopen(popen_forkserver.Popen):
    """multiprocessing's fork-server launch, minus the instruction to re-run the launcher's ``__main__`` in the
    child (for a process that needs nothing of it: the pool's probe runs ``os._exit``). Launched from a thread, it
    cannot swap ``sys.modules["__main__"]`` under the launcher's feet."""

    def _launch(self, process_obj):
        prep_data = spawn.get_preparation_data(process_obj._name)
        prep_data.pop("init_main_from_path", None)
        prep_data.pop("init_main_from_name", None)
        buf = io.BytesIO()
        set_spawning_popen(self)
        try:
            reduction.dump(prep_data, buf)
            reduction.dump(process_obj, buf)
        finally:
            set_spawning_popen(None)
        self.sentinel, w = forkserver.connect_to_new_process(self._fds)
        self.finalizer = util.Finalize(self, util.close_fds, (self.sentinel,))
        with open(w, "wb", closefd=True) as f:
            f.write(buf.getbuffer())
        self.pid = forkserver.read_signed(self.sentinel)
