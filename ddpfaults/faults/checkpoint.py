"""Checkpoint faults at the writer rank's checkpoint file on disk, whatever writes it: the writer killed with half of
it written, or the file held torn while the readers read.

These are values like every fault; their effect lives in :mod:`ddpfaults.rank.checkpoint` (the file seen through the
rank's file record), armed inside a rank when a step a fault applies to starts (:mod:`ddpfaults.rank.effects`), so the
code under test needs no change. Arming is not firing: the fault fires when the writer's checkpoint is torn or its
writer killed (a step without a save leaves it unfired).
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
        """Every rank: a torn checkpoint's handshake (flag files keyed by step) involves the readers too."""
        return None

    def same_effect(self, other: Fault) -> str | None:
        """Two checkpoint faults at one step: the first takes the writer's checkpoint file and handshake."""
        return "interrupt the step's checkpoint save" if isinstance(other, _CheckpointFault) else None

    def _fields(self) -> dict:
        fields = {"writer": str(self.writer)}
        if self.steps is not None:
            fields["step"] = _fmt(self.steps)
        return fields


class TornCheckpointWrite(_CheckpointFault):
    """The ``writer``'s checkpoint file is held torn on disk (half its bytes) while the other ranks read, then
    completed.

    The checkpoint is the first file of at least 512 bytes the writer writes in the fault's step, whatever writes it
    (``torch.save`` to a path, ``open(path, "wb")`` of a buffer ``torch.save`` filled, numpy): once complete (the
    writer moves on: another file, an ``os.replace``, a collective, its next step), it is cut to half its bytes and the
    writer held until every reader has moved on (or waits in a collective the writer has not reached), then the rest
    is written back. Deterministic, no sleeps: a reader's read at that step (``torch.load``, ``open``, numpy) first
    waits until the writer holds its file torn (or is blocked in a collective, or past its step), so a reader that does
    not synchronise reads a truncated file (``failed finding central directory``); a reader behind a barrier reads the
    whole one; an atomic save (temp file + ``os.replace``) is held before the rename, so its readers load the old
    checkpoint. The handshake uses flag files in ``ctx.shared_dir``; it applies on every rank (readers take part).
    The fired record names the file and its bytes on disk: the writer's, and each reader's that read it torn.
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
