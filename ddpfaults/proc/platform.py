"""What ddpfaults needs of the operating system, and the one check that refuses a world where it is missing.

Most process inspection goes through psutil (portable). What psutil cannot give, ddpfaults reads from Linux
itself: each thread's scheduler state (``/proc/PID/task/TID/stat``: the judge tells a rank blocked on its peers
from one computing or waiting for a core by it), and it needs ``prctl``'s child subreaper and parent-death signal
to take down what a rank starts outside its process group. Elsewhere a world is refused before any process
starts, naming what is missing; reading, rendering and comparing reports works anywhere.
"""

from __future__ import annotations

import os
import sys

import psutil

from ddpfaults import errors


def missing() -> list[str]:
    """What this machine lacks of what a world needs (empty on Linux)."""
    found = []
    if not sys.platform.startswith("linux"):
        found.append("prctl's child subreaper and parent-death signal (teardown of what ranks start)")
    if not os.path.isdir(f"/proc/{os.getpid()}/task"):
        found.append("/proc's per-thread scheduler states (telling a blocked rank from a busy one)")
    return found


def require(what: str) -> None:
    """Raise :class:`~ddpfaults.errors.UnsupportedPlatform` naming ``what`` and everything missing, unless this
    machine has all a world needs."""
    lacking = missing()
    if lacking:
        raise errors.UnsupportedPlatform(
            f"{what} need Linux; this is {sys.platform}, which lacks {' and '.join(lacking)}. "
            "Reports (python -m ddpfaults html/trace) work here."
        )


def tcp_connections() -> list:
    """This process's TCP connections (psutil's, with their descriptors)."""
    process = psutil.Process()
    return process.net_connections("tcp") if hasattr(process, "net_connections") else process.connections("tcp")
