"""The process group's rendezvous as the judge loop (:mod:`ddpfaults.judge.live.loop`) and the prover
(:mod:`ddpfaults.judge.live.prover`) see it: which rank waits in it, whether it can still complete, and when a failed
rank has abandoned it, the ranks left in it seen waiting."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ddpfaults.judge.live import activity
from ddpfaults.judge.live.watch import RankWatch
from ddpfaults.judge.verdict import is_collateral

if TYPE_CHECKING:
    from ddpfaults.judge.live.observer import Observer

ABANDON_QUIET = 0.5  # seconds the ranks left in an abandoned rendezvous must be seen idle before the verdict


def in_rendezvous(w: RankWatch) -> dict | None:
    """The "enter" event of the ``init_process_group`` rank ``w`` is in, if it has not joined the group yet."""
    if w.joined:
        return None
    return next((e for e in w.entered.values() if e.get("op") == "init_process_group"), None)


def abandoned(observer: Observer, live: list[int], now: float) -> bool:
    """True when a rank failed with its own error (not a consequence of another's) or died, and every rank still
    running waits in ``init_process_group``: in ``peer_failure="exit"`` mode the failed rank's process ends, so the
    rendezvous can never complete with it (those ranks wait for ever, or fail connecting to it) and the world is a
    crash, those ranks its collateral, as under torchrun."""
    failed = [
        w
        for w in observer.watches
        if (w.ended == "failed" and not is_collateral((w.end or {}).get("error"))) or observer.dead(w.rank, now)
    ]
    return bool(failed) and bool(live) and all(in_rendezvous(observer.watches[i]) is not None for i in live)


class QuietRendezvous:
    """Whether the ranks left in an abandoned rendezvous wait, or still run their own code: a rank that has not
    joined may be doing what its failed peer did (connecting to the store, building the backend), and fail the same
    way on its own. They wait once, over :data:`ABANDON_QUIET`, none of them computed as a rank polling its store may
    not (:data:`activity.POLLING`: a rank blocked on a peer's address in a TCPStore wants no core; one polling a
    FileStore, a little, however loaded the machine; one starved of CPU, all the time). Where the observer cannot
    tell what a main thread wanted, a rank seen runnable at any look during the spell is not waiting."""

    def __init__(self, observer: Observer):
        self.observer = observer
        self.since: float | None = None  # when the spell being judged began (None: none yet)
        self.marks: dict[int, activity.Mark] = {}

    def reset(self) -> None:
        """Forget the spell: the rendezvous is not (or no longer) abandoned."""
        self.since = None

    def idle(self, live: list[int], now: float) -> bool:
        """True once the ``live`` ranks have been seen waiting for :data:`ABANDON_QUIET`."""
        if self.since is not None:
            known = all(self.marks.get(i) is not None and self.marks[i].demand is not None for i in live)
            if known or not activity.computing(self.observer, live, first=True):
                if now - self.since < ABANDON_QUIET:
                    return False
                if not activity.computing(self.observer, live, self.marks, allowance=activity.POLLING, first=True):
                    return True
        self.since = now
        self.marks = activity.mark(self.observer, live, now)
        return False


def under_way(observer: Observer, now: float) -> bool:
    """True while the rendezvous can still complete: some rank has not joined the process group yet, and none
    has ended (finished, failed or died) without joining (its peers would then wait for it for ever)."""
    unjoined = [w for w in observer.watches if not w.joined]
    return bool(unjoined) and not any(w.ended or observer.dead(w.rank, now) for w in unjoined)
