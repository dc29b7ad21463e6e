"""How the judge sees a world's ranks: the :class:`Observer` protocol, one implementation per launcher (the local
launcher's, :class:`ddpfaults.engine.launcher.LocalWorld`; torchrun's, :class:`ddpfaults.torchrun.store.StoreWorld`).
The judge's loop (:mod:`ddpfaults.judge.live.loop`) and the deadlock prover (:mod:`ddpfaults.judge.live.prover`) both
watch through it; it imports neither."""

from __future__ import annotations

from ddpfaults.judge import deadlock
from ddpfaults.judge.live.watch import RankWatch
from ddpfaults.spec import StopReason


class Observer:
    """How the judge sees a world's ranks; ``watches[i]`` is rank i's view, kept current by :meth:`poll`.

    ``t0`` is the world's start on this process's monotonic clock; ``failed_where`` is what a rank that
    raised is doing while the verdict is pending (in ``peer_failure="exit"`` mode).
    """

    watches: list[RankWatch]
    t0: float
    failed_where = "raised; exiting"
    proof: deadlock.Proof | None = None  # what :func:`watch` proved, when it stopped with StopReason.PROVEN
    still_starting: tuple = ()  # the ranks :func:`watch` found still starting when it stopped at start-up's limit
    computing_at_deadline: tuple = ()  # the ranks :func:`watch` found computing when the hard timeout stopped it

    def poll(self, wait: float) -> None:
        """Wait up to ``wait`` seconds for news, then bring every rank's watch up to date."""
        raise NotImplementedError

    def dead(self, i: int, now: float) -> bool:
        """True if rank ``i`` is gone without reporting its end (exited, killed, heartbeat stopped)."""
        raise NotImplementedError

    def failures_seen(self, now: float) -> list[float]:
        """When this observer saw ranks fail or die (monotonic times)."""
        raise NotImplementedError

    def cpu(self, i: int, main: bool = False) -> float | None:
        """Rank ``i``'s CPU seconds so far (``main``: its main thread's alone); None if unknown. Like :meth:`demand` and
        :meth:`runnable`, read only through :func:`ddpfaults.judge.live.activity.computing`."""
        raise NotImplementedError

    def demand(self, i: int) -> float | None:
        """Seconds rank ``i``'s main thread has spent on a core or waiting in a run queue for one (None: unknown):
        against the wall clock, how much of the time it wanted a core, however little it got."""
        return None

    def runnable(self, i: int, threads: bool = False) -> bool | None:
        """True if rank ``i``'s main thread (``threads``: any of its threads) is computing right now, however little
        CPU it gets (None: unknown)."""
        return None

    def collect_stacks(self, indices: list[int]) -> None:
        """Have the given live ranks dump their main thread's stack into ``watches[i].stack``."""
        raise NotImplementedError

    def stop_requested(self, now: float) -> StopReason | None:
        """A reason to stop that only this observer knows (None: keep watching)."""
        return None

    def reported(self, i: int) -> dict | None:
        """The result rank ``i`` published with its end (value or error, traceback, site), or None."""
        raise NotImplementedError

    def death(self, i: int, reason: StopReason, now: float) -> tuple[str, str, str | None, float | None] | None:
        """``(error, output, stack, failed_at)`` if rank ``i`` died without reporting, else None."""
        raise NotImplementedError

    def collect_flight_records(self, indices: list[int]) -> None:
        """Have the given live ranks dump their flight recorder (ended ranks dumped theirs at the end)."""

    def flight_record(self, i: int) -> dict | None:
        """Rank ``i``'s flight-recorder dump, unpickled (None: not available; the tracing is the record)."""
        return None

    def exited(self, i: int) -> bool:
        """True if rank ``i``'s process is known to have ended."""
        return False

    def unstarted(self, i: int) -> bool:
        """True if rank ``i``'s process was never started (start-up ran out of time before its turn)."""
        return False

    def describe(self, i: int) -> dict:
        """Facts about rank ``i`` for its result: ``pid``, ``exitcode``, ``output``, ``events`` (t since start)."""
        raise NotImplementedError

    def live(self, now: float) -> list[int]:
        """Ranks still running their function (not ended, not dead)."""
        return [w.rank for w in self.watches if not w.ended and not self.dead(w.rank, now)]

    def lingers(self, i: int, now: float, peer_failure: str) -> bool:
        """True if rank ``i`` ended and keeps its process and its connections to its peers open until the verdict
        (a finished rank, unless its process ends with its job: a script's; a failed one in ``peer_failure="linger"``
        mode), so that a peer waiting on it waits for ever instead of reading that its connections closed."""
        w = self.watches[i]
        if w.links_dropped or self.dead(i, now) or self.exited(i):
            return False
        if w.ended == "finished":
            return not w.end.get("exits")
        return w.ended == "failed" and peer_failure == "linger"

    def since_start(self, t: float) -> float:
        """An event's time ``t`` (as its rank stamped it) in seconds since the world's start."""
        return t - self.t0
