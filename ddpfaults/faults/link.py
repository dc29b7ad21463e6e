"""Link faults: one rank's connection to its peers is slow, or drops, at one collective.

They act where the collective tracing sees a collective (:meth:`~ddpfaults.faults.base.Fault.before_collective`):
a torch.distributed call, or with ``op="ddp_bucket"`` the all_reduce of a DDP gradient bucket (through ddpfaults'
comm hook, as ``SkippedCollective`` does). Each acts once per rank and step, on the first matching collective.
"""

from __future__ import annotations

import math
import time

from ddpfaults.errors import FaultError
from ddpfaults.faults.base import Fault
from ddpfaults.faults.step import CollectiveFault, SkippedCollective, ops_overlap


class _LinkFault(CollectiveFault):
    """A fault acting on the first collective ``op`` of ``rank`` at ``step``."""

    def same_effect(self, other: Fault) -> str | None:
        """A skip of an overlapping op would swallow the collective this fault acts on."""
        if isinstance(other, SkippedCollective) and ops_overlap(self.op, other.op):
            return f"act on the first {self.op or other.op or 'collective'} (the skip would swallow it)"
        return None


class SlowLink(_LinkFault):
    """``rank``'s first collective ``op`` at ``step`` is held back ``delay`` seconds (a slow or congested link):
    its peers wait for it inside the collective, and the world completes: a straggler, not a hang. (The rank sleeps
    outside any collective, so the world is not judged hung even for a ``delay`` longer than the stall window; only
    the timeout ends it: docs/measurements.md.) ``op`` as for ``SkippedCollective``;
    ``delay`` a positive finite number of seconds."""

    def __init__(self, *, rank, step, op=None, delay: float, group=None):
        super().__init__(rank=rank, step=step, op=op, group=group)
        if isinstance(delay, bool) or not isinstance(delay, (int, float)) or not 0 < delay < math.inf:
            raise FaultError(f"SlowLink: delay must be a positive finite number of seconds, got {delay!r}")
        self.delay = float(delay)

    def before_collective(self, ctx, op: str, maker: str = "user") -> str | None:
        """Sleep ``delay`` seconds before the first matching collective of the step."""
        if not (self.matches_at(ctx, op, maker) and ctx.once(self)):
            return None
        time.sleep(self.delay)
        return f"held {op} back {self.delay:g} s"

    def _fields(self) -> dict:
        return {**super()._fields(), "delay": repr(self.delay)}


class LinkDropped(ConnectionError):
    """What the rank whose links ``DroppedLink`` dropped raises, at the collective it could not run."""


class DroppedLink(_LinkFault):
    """``rank``'s connections to all its peers drop as it enters its first collective ``op`` at ``step``: every
    gloo TCP connection of the rank is shut down (both directions) and the rank raises :class:`LinkDropped` there
    instead of running the collective; its peers, in or entering that collective, get gloo's "Connection closed by
    peer". All peers at once: one peer alone cannot be chosen (gloo's sockets do not say which rank is at their
    other end). It fires only if a connection was shut down. Carried out inside the rank by
    :mod:`ddpfaults.rank.effects` (with :mod:`ddpfaults.rank.links`).

    Why the rank raises its own error: with gloo's message on every rank (the dropping rank reads end-of-file
    too), every failure looks like a consequence of another's and the judge named whichever rank raised first
    (docs/measurements.md).
    """

    def same_effect(self, other: Fault) -> str | None:
        """Two drops of overlapping ops: the first leaves the second no connection to drop."""
        if isinstance(other, DroppedLink):
            if ops_overlap(self.op, other.op):
                return f"drop the links at the first {self.op or other.op or 'collective'}"
        return super().same_effect(other)
