"""Carrying out ``DroppedLink`` inside a rank: find the rank's gloo TCP connections and shut them down.

A rank's established TCP sockets are found through ``/proc/self/fd`` (``socket:[inode]``) and
``/proc/self/net/tcp{,6}`` (state ``01``, ESTABLISHED). In a local world the store is a FileStore, so every one
of them is a gloo pair; a connection to or from ``MASTER_PORT`` (a TCPStore, in a script world) is left alone.
``shutdown(SHUT_RDWR)`` on a duplicate of the descriptor ends the connection in both directions (gloo still owns
its descriptor): the peer reads end-of-file, as when the link or the process behind it goes away.
"""

from __future__ import annotations

import os
import socket

ESTABLISHED = "01"


def _tcp_table() -> dict[int, tuple[int, int]]:
    """inode -> (local port, remote port) of this network namespace's established TCP connections."""
    table = {}
    for name in ("tcp", "tcp6"):
        try:
            with open(f"/proc/self/net/{name}") as f:
                next(f)
                for line in f:
                    fields = line.split()
                    if fields[3] == ESTABLISHED:
                        ports = (int(fields[1].rsplit(":", 1)[1], 16), int(fields[2].rsplit(":", 1)[1], 16))
                        table[int(fields[9])] = ports
        except OSError:
            continue
    return table


def gloo_sockets() -> list[int]:
    """The descriptors of this process's established TCP connections, the store's excepted."""
    table = _tcp_table()
    store_port = int(os.environ.get("MASTER_PORT", "0") or 0)
    found = []
    for name in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if link.startswith("socket:[") and int(link[8:-1]) in table:
            if store_port and store_port in table[int(link[8:-1])]:
                continue
            found.append(int(name))
    return sorted(found)


def drop_all() -> int:
    """Shut down every gloo connection of this process; return how many were shut down."""
    dropped = 0
    for fd in gloo_sockets():
        try:
            sock = socket.socket(fileno=os.dup(fd))
        except OSError:
            continue
        try:
            sock.shutdown(socket.SHUT_RDWR)
            dropped += 1
        except OSError:
            pass
        finally:
            sock.close()
    return dropped
