"""Checkpoint faults: the writer rank's checkpoint file is killed halfway (whatever writes it), or its ``torch.save``
torn.

These are values like every fault; their effect lives in :mod:`ddpfaults.rank.checkpoint` (the file on disk, seen
through the rank's file record, for ``WriterKilledMidSave``; the interception of ``torch.save`` / ``torch.load`` for
``TornCheckpointWrite``), armed inside a rank when a step a fault applies to starts (:mod:`ddpfaults.rank.effects`),
so the code under test needs no change. Arming is not firing: the fault fires when the writer's save is torn or killed
(a step without a save leaves it unfired).
"""

from __future__ import annotations

from ddpfaults.errors import FaultError
from ddpfaults.faults.base import Fault, _fmt


class _CheckpointFault(Fault):
    """A fault on the ``writer`` rank's checkpoint save (armed when a step it applies to starts)."""

    rank_arg = "writer"
    seam = "torch_save"

    def __init__(self, *, writer: int = 0, step=None):
        if isinstance(writer, bool) or not isinstance(writer, int) or writer < 0:
            raise FaultError(f"{type(self).__name__}: writer must be a non-negative int (a rank), got {writer!r}")
        super().__init__(rank=writer, step=step)

    @property
    def writer(self) -> int:
        """The rank whose save is hit."""
        return self.ranks[0]

    @property
    def effect_ranks(self) -> None:
        """Every rank: a checkpoint fault's handshake (flag files keyed by step) involves the readers too."""
        return None

    def same_effect(self, other: Fault) -> str | None:
        """Two checkpoint faults at one step: the first takes the writer's save (and the step's handshake)."""
        return "interrupt the step's checkpoint save" if isinstance(other, _CheckpointFault) else None

    def _fields(self) -> dict:
        fields = {"writer": str(self.writer)}
        if self.steps is not None:
            fields["step"] = _fmt(self.steps)
        return fields


class TornCheckpointWrite(_CheckpointFault):
    """The ``writer``'s ``torch.save`` is held mid-file until every other rank has tried to load it
    (or is waiting in a collective the writer has not reached), then completes.

    Deterministic, no sleeps: a reader's ``torch.load`` at that step first waits for the writer to
    be mid-file, so a reader that does not synchronise reads a truncated file
    (``failed finding central directory``); a reader behind a barrier never sees it. The
    handshake uses flag files in ``ctx.shared_dir``. Applies on every rank (readers take part: a reader notes
    each collective it enters, so the writer stops holding for a reader blocked there).
    """

    def applies(self, rank: int, step: int | None) -> bool:
        """Every rank, at the fault's steps: the writer tears, the readers take part in the handshake."""
        return self.steps is None or (step is not None and step in self.steps)


class WriterKilledMidSave(_CheckpointFault):
    """The ``writer`` process is SIGKILLed with half of its checkpoint file's bytes on disk.

    The checkpoint is the first file of at least 512 bytes the writer writes in the fault's step, whatever writes it
    (``torch.save`` to a path, ``open(path, "wb")`` of a buffer ``torch.save`` filled, numpy; not a library writing
    outside Python's I/O, such as safetensors' Rust ``save_file``): once
    complete (the writer moves on to another file, an ``os.replace``, a collective, its next step), it is cut to half
    its bytes and the writer killed. The engine reports it DIED ("was killed by SIGKILL"). An in-place save leaves a
    truncated checkpoint; an atomic one (temp file + ``os.replace``) is killed before the rename and leaves the last
    good one intact, as under torchrun.
    """
