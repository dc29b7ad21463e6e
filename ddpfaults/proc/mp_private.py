"""Every use of multiprocessing's private API, in one place: what a Python upgrade may break.

The standard library offers no public way to learn the fork server's pid or socket address, to tell whether code
runs in the fork server's ``main`` (its preload step), or to ask the fork server for a process without having it
re-run the launcher's ``__main__`` first. Used by the launcher (its census and pool) and by the fork server itself
(:mod:`ddpfaults.rank.forkserver`).
"""

from __future__ import annotations

import io
import sys
from multiprocessing import forkserver, popen_forkserver, reduction, spawn, util
from multiprocessing.context import set_spawning_popen


def fork_server_pid() -> int | None:
    """The pid of this process's multiprocessing fork server, None if none was started."""
    return getattr(forkserver._forkserver, "_forkserver_pid", None)


def fork_server_address() -> str | None:
    """The fork server's socket path (in the launcher's ``pymp-*`` temp dir), None if none was started."""
    return getattr(forkserver._forkserver, "_forkserver_address", None)


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
