"""Distributed Checkpoint (DCP) faults: a checkpoint file torn or its writer killed as it is written, a rank whose view
of the checkpoint directory lags (an eventually-consistent filesystem), an ``async_save`` whose writer dies before its
future completes.

Values like every fault; their effect lives in :mod:`ddpfaults.rank.dcp` (armed when a step they apply to starts,
through :mod:`ddpfaults.rank.effects`), so the code under test calls ``dcp.save``/``dcp.load``/``os.path.exists`` as
it would anyway. Arming is not firing: each fires when it tears, kills or hides something.
"""

from __future__ import annotations

from ddpfaults.errors import FaultError
from ddpfaults.faults.base import Fault, _fmt, _require_rank, _require_step

#: what :class:`TornDcpWrite` tears: the writer's own data file(s) (``__<rank>_<n>.distcp``) or ``.metadata``
DCP_PARTS = ("shard", "metadata")


class TornDcpWrite(Fault):
    """The ``writer``'s DCP file is cut to half its length as it is written at ``step`` (when the file is fsynced:
    DCP's ``FileSystemWriter`` fsyncs each file it writes). ``part="shard"``: the writer's own data file (every rank
    writes its shard); ``part="metadata"``: the ``.metadata`` file the coordinator writes (``writer`` must be the
    coordinator, rank 0 by default). With ``killed=False`` the save returns as if nothing happened (a torn write the
    storage never reported) and a later ``dcp.load`` of that checkpoint raises ``CheckpointException`` on every rank,
    naming the rank(s) that failed to read; with ``killed=True`` the writer is SIGKILLed there, mid-save (a lost
    node), and its peers wait in DCP's collectives until gloo tells them it is gone.
    """

    rank_arg = "writer"
    seam = "dcp"

    def __init__(self, *, writer: int = 0, step, part: str = "shard", killed: bool = False):
        if isinstance(writer, bool) or not isinstance(writer, int) or writer < 0:
            raise FaultError(f"TornDcpWrite: writer must be a non-negative int (a rank), got {writer!r}")
        super().__init__(rank=writer, step=step)
        _require_step(self)
        if part not in DCP_PARTS:
            raise FaultError(f"TornDcpWrite: part must be one of {', '.join(map(repr, DCP_PARTS))}, got {part!r}")
        if not isinstance(killed, bool):
            raise FaultError(f"TornDcpWrite: killed must be True or False, got {killed!r}")
        self.part, self.killed = part, killed

    @property
    def writer(self) -> int:
        """The rank whose write is torn."""
        return self.ranks[0]

    @property
    def kills_with(self) -> str | None:
        """SIGKILL when ``killed``."""
        return "SIGKILL" if self.killed else None

    @property
    def leaves_torn_file(self) -> bool:
        """True unless ``killed`` (a writer killed mid-write is named by its death)."""
        return not self.killed

    def wants(self, name: str) -> bool:
        """True if a file of basename ``name`` is the part this fault tears (``.metadata`` is written as a temporary
        file renamed into place)."""
        if self.part == "metadata":
            return name.startswith(".metadata")
        return name.startswith(f"__{self.writer}_") and name.endswith(".distcp")

    def same_effect(self, other: Fault) -> str | None:
        """Two tears of one writer at one step: the first takes its save."""
        return "tear the step's DCP save" if isinstance(other, TornDcpWrite) else None

    def _fields(self) -> dict:
        fields = {"writer": str(self.writer), "step": _fmt(self.steps)}
        if self.part != "shard":
            fields["part"] = repr(self.part)
        if self.killed:
            fields["killed"] = "True"
        return fields


class CheckpointNotVisible(Fault):
    """At ``step``, ``rank`` does not see DCP checkpoints yet: a directory holding a ``.metadata`` file (and what is
    in it) does not exist for ``os.path.exists``/``isdir``/``isfile`` and is missing from ``os.listdir`` on that
    rank, as on a shared filesystem whose writes are not yet visible everywhere. Its peers see the checkpoint. Fires
    each time it hides one (recorded once per step)."""

    data_only = True  # what the rank sees of the filesystem; its wrappers stay inert once its step has passed

    def __init__(self, *, rank, step):
        super().__init__(rank=rank, step=step)
        _require_rank(self)
        _require_step(self)

    def same_effect(self, other: Fault) -> str | None:
        """Two lagging views of one rank at one step: one view."""
        return "hide the rank's checkpoints" if isinstance(other, CheckpointNotVisible) else None


class AsyncSaveKilled(Fault):
    """The ``writer`` is SIGKILLed as its ``dcp.async_save`` at ``step`` returns, before the save's future completes
    (a preempted node): its shard and the ``.metadata`` may never be written, and a checkpoint whose "latest"
    pointer advanced before the future completed points at nothing loadable."""

    rank_arg = "writer"
    seam = "dcp"

    def __init__(self, *, writer: int = 0, step):
        if isinstance(writer, bool) or not isinstance(writer, int) or writer < 0:
            raise FaultError(f"AsyncSaveKilled: writer must be a non-negative int (a rank), got {writer!r}")
        super().__init__(rank=writer, step=step)
        _require_step(self)

    @property
    def writer(self) -> int:
        """The rank that is killed."""
        return self.ranks[0]

    @property
    def kills_with(self) -> str:
        """It kills its writer with SIGKILL."""
        return "SIGKILL"

    def same_effect(self, other: Fault) -> str | None:
        """A torn or killed save of the same writer and step: the first takes the save."""
        if isinstance(other, (AsyncSaveKilled, TornDcpWrite)):
            return "interrupt the step's DCP save"
        return None

    def _fields(self) -> dict:
        return {"writer": str(self.writer), "step": _fmt(self.steps)}
