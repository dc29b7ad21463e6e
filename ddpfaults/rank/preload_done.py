"""The fork server's last preload (``ddpfaults.engine.pool`` lists it after torch and the rank's modules): it moves
everything the preload made into the garbage collector's permanent generation (``gc.freeze``), as Python's ``gc``
documentation advises before forking. A rank then never walks those objects in a full collection: walking them
cost a rank ~150 ms of CPU and ~19,000 page faults (each a copy-on-write of a page of the fork server's heap), and
the preloaded objects are never garbage anyway. Imported anywhere else, it does nothing."""

from __future__ import annotations

import gc

from ddpfaults.rank.forkserver import in_fork_server

if in_fork_server():
    gc.freeze()
