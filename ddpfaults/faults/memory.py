"""``OutOfMemory``: one rank runs out of memory at a step (a batch too large for its host, a leak reaching the
limit). Carried out inside the rank by :mod:`ddpfaults.rank.effects` (with :mod:`ddpfaults.rank.memory`)."""

from __future__ import annotations

from ddpfaults.faults.base import Fault, _require_rank, _require_step

#: how far above the rank's address space at the step's start its limit is set: allocations up to about this
#: much still succeed (gloo's and Python's small ones), one beyond it fails
MARGIN = 32 * 2**20


class OutOfMemory(Fault):
    """``rank`` runs out of memory when ``step`` starts: its address space is limited (``RLIMIT_AS``) to what it
    uses plus 32 MiB (:data:`MARGIN`) until its next step starts, so its next larger allocation fails as on a host
    out of memory (torch: ``RuntimeError`` "DefaultCPUAllocator: can't allocate memory"; numpy: ``MemoryError``).

    It fires when an allocation fails under the limit (the rank's error, or one its code catches); a step that
    allocates less than the margin leaves it unfired, as it changed nothing. Where the limit cannot be set, the rank
    raises ``MemoryError("injected out of memory ...")`` at the step instead.
    """

    def __init__(self, *, rank, step):
        super().__init__(rank=rank, step=step)
        _require_rank(self)
        _require_step(self)

    def unfired_hint(self, calls: list) -> str:
        """Its limit is set when its step starts; it fires only when an allocation fails under it."""
        return (
            f"no allocation of its step failed under the address-space limit it sets ({MARGIN // 2**20} MiB above "
            f"the rank's use): the step allocated less, so the fault changed nothing"
        )

    def same_effect(self, other: Fault) -> str | None:
        """Two OutOfMemory of one rank and step set one limit."""
        return "limit the address space" if isinstance(other, OutOfMemory) else None
