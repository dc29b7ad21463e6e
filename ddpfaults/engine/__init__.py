"""The local engine: start a world's rank processes on this machine, watch them, pool healthy ones, reap all.

Whoever must see every world this process runs (the pytest plugin, for its reports) registers with
:func:`watching`; each judged world is handed to every watcher by :func:`finished`, whether it was run by
``run_world``, ``run_script``, a scenario or the ``ddp_world`` fixture. Light: importing it imports no torch.
"""

from __future__ import annotations

import contextlib

_watchers: list = []


@contextlib.contextmanager
def watching(callback):
    """While the block runs, call ``callback(result)`` with every world this process judges."""
    _watchers.append(callback)
    try:
        yield
    finally:
        _watchers.remove(callback)


def finished(result) -> None:
    """Hand a judged world to every watcher."""
    for callback in list(_watchers):
        callback(result)
