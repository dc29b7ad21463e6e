"""Carrying out ``DroppedLink`` inside a rank: find the rank's gloo TCP connections and shut them down.

A rank's established TCP sockets, with their descriptors, are psutil's (``net_connections``). In a local world the
store is a FileStore, so every one of them is a gloo pair; a connection to or from ``MASTER_PORT`` (a TCPStore, in a
script world) is left alone. ``shutdown(SHUT_RDWR)`` on a duplicate of the descriptor ends the connection in both
directions (gloo still owns its descriptor): the peer reads end-of-file, as when the link or the process behind it
goes away.
"""

from __future__ import annotations

import os
import socket

import psutil

from ddpfaults.proc import platform


def gloo_sockets() -> list[int]:
    """The descriptors of this process's established TCP connections, the store's excepted."""
    store_port = int(os.environ.get("MASTER_PORT", "0") or 0)
    found = []
    for c in platform.tcp_connections():
        if c.status != psutil.CONN_ESTABLISHED or c.fd < 0 or not c.raddr:
            continue
        if store_port and store_port in (c.laddr.port, c.raddr.port):
            continue
        found.append(c.fd)
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
