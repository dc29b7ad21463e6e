"""The one answer to "is this rank computing, or about to compute?" for every rule of the live judge: the stall rule,
the hard timeout and start-up (:mod:`ddpfaults.judge.live.loop`), the abandoned rendezvous
(:mod:`ddpfaults.judge.live.rendezvous`) and the deadlock prover's confirmations (:mod:`ddpfaults.judge.live.prover`).

Only this module reads an :class:`~ddpfaults.judge.live.observer.Observer`'s evidence of computing: a main thread's
demand for a core (:meth:`~ddpfaults.judge.live.observer.Observer.demand`), CPU seconds
(:meth:`~ddpfaults.judge.live.observer.Observer.cpu`) and scheduler state
(:meth:`~ddpfaults.judge.live.observer.Observer.runnable`). The evidence is read in one order, the best the observer
has: demand where the kernel counts it (schedstat: run, or wait in a run queue to run), else CPU time, else looks at
the threads' state now. What differs between the rules is said as parameters of :func:`computing`: since when (a
:func:`mark` taken at the window's start; none: now), which threads count, and how much a rank that does *not*
compute may use (an :class:`Allowance`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ddpfaults.judge.live.observer import Observer

RUNNABLE_LOOKS, RUNNABLE_GAP = 3, 0.005  # looks at the ranks' /proc state (and seconds between them)
#: the share of the time a main thread that computes wants a core (runs, or waits in a run queue to), however starved;
#: one blocked in a collective wants none, one sleeping in a polling loop (``time.sleep(0.05)``) 0.1-0.2%
COMPUTING_DEMAND = 0.05
#: the share of a core a main thread waiting in a rendezvous may use (polling a FileStore); more is computing
POLLING_CPU = 0.05
#: the share of the time a main thread waiting in a rendezvous may want a core (run, or wait in a run queue to): a rank
#: polling a FileStore every 10 ms beside 8 CPU hogs on 2 cores wants one 14% of the time; one computing, all the time
POLLING_DEMAND = 0.5
BUSY_CPU = 0.2  # a rank using more than this fraction of a core since its last progress is computing


@dataclass(frozen=True)
class Allowance:
    """What a rank that does not compute may use over a window: its main thread may want a core ``demand`` of the
    time, where the kernel counts it (None: demand is not asked); it may use ``cpu`` of a core (None: any CPU time
    at all is computing, asked only where demand is not counted; a share: asked beside demand too); ``look``: where
    neither is known, the threads' state is looked at (else the rank counts as not computing)."""

    demand: float | None
    cpu: float | None
    look: bool = True


#: a rank waiting on its peers (the stall rule, the hard timeout, start-up): demand alone decides where it is counted
WAITING = Allowance(demand=COMPUTING_DEMAND, cpu=None)
#: a rank waiting in a rendezvous, polling its store: a little of a core, however loaded the machine
POLLING = Allowance(demand=POLLING_DEMAND, cpu=POLLING_CPU)
#: a process (every thread) busy since its last progress, by its CPU time alone (a rank's progress marks only that)
BUSY = Allowance(demand=None, cpu=BUSY_CPU, look=False)


@dataclass(frozen=True)
class Mark:
    """One rank's evidence at a window's start: when (monotonic seconds), its CPU seconds and its main thread's
    demand (seconds run or waiting to run) then (None: unknown)."""

    at: float
    cpu: float | None
    demand: float | None = None


def mark(observer: Observer, indices: list[int], now: float) -> dict[int, Mark]:
    """Each rank's :class:`Mark` at ``now``: its main thread's CPU seconds and demand (a window :func:`computing`
    measures with ``threads=False``)."""
    return {i: Mark(now, observer.cpu(i, main=True), observer.demand(i)) for i in indices}


def computing(
    observer: Observer,
    indices: list[int],
    since: Mapping[int, Mark] | None = None,
    *,
    threads: bool = False,
    allowance: Allowance = WAITING,
    first: bool = False,
    looks: int = RUNNABLE_LOOKS,
    unknown: bool = False,
) -> list[int]:
    """The ranks among ``indices`` computing, or about to (runnable: wanting a core, however little they get).

    ``since``: each rank's :class:`Mark` at the window's start (a rank without one, or no marks at all: the threads'
    state now alone). Over the window a rank computes if its main thread wanted a core more than ``allowance.demand``
    of the time, where the kernel counts that (starved or not: 256 ranks on 2 cores get a few ms each per second,
    and want one all the time); where it does not, if it used more CPU than ``allowance.cpu`` of a core. Where
    neither is known (and ``allowance.look``), it computes if it is seen runnable at one of ``looks`` looks at its
    state, :data:`RUNNABLE_GAP` s apart (a process starved of CPU is seen runnable at some look, one that waits at
    none; one look is "runnable right now": a proof's second look).

    ``threads``: any thread of the rank counts (its CPU time is the whole process's; its demand is not asked, the
    kernel's count being the main thread's), not its main thread alone: a proof must see no thread of a waiting
    rank run, where the stall rule and start-up ask of the main thread (gloo's helper threads run for a waiting
    one). ``first``: stop looking once one rank is found (the caller asks whether any computes). ``unknown``: where
    the observer cannot tell (no count, and a look that answers nothing), the rank counts as computing (a proof rests
    on no rank's idleness that is not seen); else as not.
    """
    now = time.monotonic()
    found: set[int] = set()
    to_look = []
    for i in indices:
        start = (since or {}).get(i)
        decided = _over_window(observer, i, start, now, threads, allowance) if start is not None else None
        if decided is True:
            found.add(i)
        elif decided is None and allowance.look:
            to_look.append(i)
        elif decided is None and unknown:
            found.add(i)
    if to_look and not (first and found):
        found |= _seen_runnable(observer, to_look, threads, first, looks, unknown)
    return [i for i in indices if i in found]


def _over_window(
    observer: Observer, i: int, start: Mark, now: float, threads: bool, allowance: Allowance
) -> bool | None:
    """Whether rank ``i`` computed since ``start`` by its counts (None: they cannot tell)."""
    elapsed = max(now - start.at, 1e-3)
    cpu = observer.cpu(i, main=not threads) if start.cpu is not None else None
    used = (cpu - start.cpu) / elapsed if cpu is not None else None
    demand = observer.demand(i) if not threads and allowance.demand is not None and start.demand is not None else None
    if demand is not None:
        if (demand - start.demand) / elapsed > allowance.demand:
            return True
        return allowance.cpu is not None and used is not None and used > allowance.cpu
    if used is not None and used > (allowance.cpu or 0.0):
        return True
    return None


def _seen_runnable(
    observer: Observer, indices: list[int], threads: bool, first: bool, looks: int, unknown: bool
) -> set[int]:
    """The ranks among ``indices`` seen runnable at one of ``looks`` looks (``first``: stop at the first look that
    sees one; ``unknown``: a look the observer cannot answer counts as runnable)."""
    found: set[int] = set()
    for look in range(looks):
        for i in indices:
            if i not in found and ((seen := observer.runnable(i, threads=threads)) or (seen is None and unknown)):
                found.add(i)
        if (found and first) or len(found) == len(indices):
            break
        if look + 1 < looks:
            time.sleep(RUNNABLE_GAP)
    return found


def at_progress(observer: Observer, indices: list[int]) -> dict[int, Mark]:
    """Each rank's :class:`Mark` at its last progress (its last event): the whole process's CPU seconds then (a window
    :func:`computing` measures with ``threads=True``)."""
    return {i: Mark(observer.watches[i].last_progress, observer.watches[i].cpu_at_progress) for i in indices}
