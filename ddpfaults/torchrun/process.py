"""What a torchrun rank does to its own process: sever its peer connections, copy its stderr, dump its stack."""

from __future__ import annotations

import faulthandler
import os
import socket
import stat
import sys
import tempfile
import threading

from ddpfaults.judge.live.watch import main_thread
from ddpfaults.proc import platform


def sever_peer_sockets(keep_ports: set) -> int:
    """Shut down this process's TCP connections except the store's: what its exit would do to its peers."""
    severed = 0
    for fd in sorted({c.fd for c in platform.tcp_connections() if c.fd >= 0}):
        try:
            if not stat.S_ISSOCK(os.fstat(fd).st_mode):
                continue
            sock = socket.socket(fileno=os.dup(fd))
        except OSError:
            continue
        try:
            if sock.type != socket.SOCK_STREAM or sock.family not in (socket.AF_INET, socket.AF_INET6):
                continue
            peer, local = sock.getpeername(), sock.getsockname()
            if peer[1] not in keep_ports and local[1] not in keep_ports:
                sock.shutdown(socket.SHUT_RDWR)
                severed += 1
        except OSError:
            pass  # a listening or unconnected socket
        finally:
            sock.close()  # the duplicate only
    return severed


def tee_stderr(path: str):
    """Copy this process's fd 2 into ``path`` too, through a ``tee`` child that outlives an abrupt death.

    The judge reads a died rank's file (when it runs on the same node) for the line that says why, as
    the local engine reads a rank's captured output. The child inherits the blocked held signals, so
    torchrun's SIGTERM to the process group does not stop it; it ends when every writer has exited.
    """
    import subprocess

    read_end, write_end = os.pipe()
    try:
        proc = subprocess.Popen(["tee", "-a", path], stdin=read_end, stdout=os.dup(2), close_fds=True)
    except OSError:
        os.close(read_end)
        os.close(write_end)
        return None
    os.close(read_end)
    sys.stderr.flush()
    os.dup2(write_end, 2)
    os.close(write_end)
    return proc


def dump_main_stack() -> str:
    """This process's main-thread Python stack, dumped by faulthandler (works while it waits in C++)."""
    with tempfile.TemporaryFile("w+") as f:
        faulthandler.dump_traceback(file=f, all_threads=True)
        f.seek(0)
        return main_thread(f.read(), threading.main_thread().ident)
