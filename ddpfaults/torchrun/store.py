"""The world seen through the torch.distributed store: the rank-side event sink and the judge.

Under torchrun no parent process sees every rank, so each rank publishes what the local launcher
reads from its files (events, heartbeat, CPU time, result, its stack on request) as keys of one
store. One rank, the *judge* (rank 0, unless it died), reads them all and judges the world with the
local engine's pure functions (:mod:`ddpfaults.judge.verdict`) and the same rules: a world ends when every
rank finished, failed or died; it is hung when nothing moved for ``stall`` seconds and every live
rank waits on its peers; ``timeout`` is the hard cap. The store keys, under the run's prefix:

- ``t0``: the world's start (rank 0's wall clock); ``judge``: the rank holding the judge's seat;
  ``verdict``: ``0`` pending, then ``1`` matched the expectation, ``2`` did not, ``3`` the judge failed, ``4``
  torchrun restarts the world (:mod:`ddpfaults.torchrun.restarts`, whose keys are the run's, not an attempt's);
- ``hb/R``, ``cpu/R``: rank R's heartbeat counter and CPU time (microseconds), every :data:`TICK`;
- ``evn/R``, ``ev/R/K``: how many event chunks rank R published, and chunk K (JSON lines);
- ``res/R``: rank R's pickled result, set before its ``finished`` / ``failed`` event;
- ``stackreq/R``, ``stackn/R``, ``stack/R``: stack dumps asked of rank R, answered, the last dump;
- ``fr/R``: rank R's flight-recorder dump (torch's pickle), set with each stack answer and before its result.

Event times are wall-clock seconds (ranks may sit on different machines); reports show them as
seconds since ``t0``.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import socket
import threading
import time

from ddpfaults import events
from ddpfaults.judge.checks import recovery
from ddpfaults.judge.live import loop
from ddpfaults.judge.live.observer import Observer
from ddpfaults.judge.live.watch import RankWatch, main_thread, tail, telling_line
from ddpfaults.judge.results import WorldResult
from ddpfaults.spec import RunSpec, StopReason

TICK = 0.05  # seconds between a rank's heartbeats, and between the judge's looks at the store
DEAD_AFTER = 3.0  # a started rank whose heartbeat stops this long died (a stuck GIL can starve it ~1 s)
DEAD_AFTER_TERM = 0.5  # ... once torchrun's agent is stopping the ranks (it only does when a rank exited)
TERM_GRACE = loop.PEER_EXIT_GRACE  # after the agent's first SIGTERM, the judge waits this long for reports


def rank_keys(rank: int) -> list[str]:
    """The counter keys of ``rank`` that must exist before anyone reads them (created with ``add(key, 0)``)."""
    return [f"hb/{rank}", f"cpu/{rank}", f"evn/{rank}", f"stackreq/{rank}", f"stackn/{rank}"]


def ensure_keys(store, keys) -> None:
    """Create missing counter keys as ``0`` (``add`` never blocks; ``get`` of a missing key would)."""
    for key in keys:
        store.add(key, 0)


class StoreEventLog:
    """The rank-side event sink: :class:`~ddpfaults.rank.context.EventLog`'s ``emit``, published to the store.

    Events are buffered; the watchdog publishes the buffer as one chunk per tick (:meth:`flush`), and
    the kinds in :data:`URGENT` are published at once through ``store`` (the main thread's client), so a
    rank that dies abruptly still shows its last step and the fault it fired. Every write of a rank's
    events and result goes through one lock, in order: the result before the event that announces it.
    """

    URGENT = frozenset({"start", "step", "fault", "failed", "finished"})

    def __init__(self, rank: int, store=None):
        self.rank = rank
        self.store = store
        self.chunks = 0
        self._lines: list[str] = []
        self._lock = threading.Lock()

    def emit(self, kind: str, **fields) -> None:
        """Record one event stamped with the wall clock (``t`` and ``wall`` alike, the fields every event sink
        gives; published now if its kind is urgent)."""
        now = time.time()
        line = events.encode(events.event(kind, t=now, wall=now, **fields))
        with self._lock:
            self._lines.append(line)
        if kind in self.URGENT and self.store is not None:
            try:
                self.flush(self.store)
            except Exception:  # noqa: BLE001 - never into user code: the watchdog publishes it next tick
                pass

    def flush(self, store, keys=(), values=()) -> None:
        """Publish the buffered events as the next chunk, with ``keys``/``values`` in the same request."""
        me = self.rank
        with self._lock:
            keys, values = list(keys), list(values)
            if self._lines:
                keys += [f"ev/{me}/{self.chunks}", f"evn/{me}"]
                values += ["".join(self._lines), str(self.chunks + 1)]
            if keys:
                store.multi_set(keys, values)
            if self._lines:
                self.chunks, self._lines = self.chunks + 1, []

    def set(self, store, key: str, value) -> None:
        """Set one key, ordered with the event publishing (e.g. the result before its end event)."""
        with self._lock:
            store.set(key, value)


class StoreRankWatch(RankWatch):
    """The judge's view of one rank: :class:`~ddpfaults.judge.live.watch.RankWatch` fed from store chunks, plus
    liveness."""

    def __init__(self, rank: int):
        super().__init__(rank, "")
        self.chunks = 0  # event chunks consumed
        self.hb = None  # last heartbeat counter seen (0: never beat)
        self.hb_seen = None  # judge clock when it last changed
        self.cpu = None  # CPU seconds, as last published
        self.pid = self.host = self.output = None
        self.terminated = None  # judge clock when its "terminated" event (the agent's signal) was seen
        self.failed_seen = None  # judge clock when its "failed" event was seen

    def feed(self, chunk: bytes, now: float) -> None:
        """Apply one chunk of JSON-lines events, seen at judge time ``now``."""
        lines = [line for line in chunk.split(b"\n") if line.strip()]
        for line in lines:
            event = events.decode(line)
            self._apply(event)
            kind = event["k"]
            if kind == "start":
                self.pid, self.host, self.output = event.get("pid"), event.get("host"), event.get("output")
            elif kind == "terminated" and self.terminated is None:
                self.terminated = now
            elif kind == "failed":
                self.failed_seen = now
        if lines:
            self.last_progress = now
            self.cpu_at_progress = self.cpu

    def local_output(self) -> str:
        """The tail of the rank's stderr copy, if it was written on this node (else "")."""
        if not self.output or self.host != socket.gethostname() or not os.path.exists(self.output):
            return ""
        return tail(self.output)

    def dead(self, now: float, terminating: bool) -> bool:
        """True if the rank started, has not ended and its heartbeat stopped."""
        if self.ended or not self.hb:
            return False
        return now - self.hb_seen >= (DEAD_AFTER_TERM if terminating else DEAD_AFTER)


class SeatLost(Exception):
    """Another rank took the judge's seat: this judge stops."""


class StoreWorld(Observer):
    """The world seen through the store by the rank holding the judge's seat (:func:`judge_world` runs it).

    ``holds_seat()`` is asked at every poll; once it is False the judging stops (another rank judges).
    """

    failed_where = "raised; peer connections closed, waiting for the verdict"

    def __init__(self, store, *, spec: RunSpec, t0_wall: float, holds_seat=lambda: True):
        self.store = store
        self.spec = spec
        self.holds_seat = holds_seat
        self.t0_wall = t0_wall
        self.t0 = t0_wall - (time.time() - time.monotonic())  # the world's start on this process's monotonic clock
        self.watches = [StoreRankWatch(r) for r in range(spec.world_size)]
        self.answered: set = set()  # ranks that answered a stack request (with a flight-recorder dump)
        ensure_keys(store, [k for r in range(spec.world_size) for k in rank_keys(r)])

    # -- gathering ----------------------------------------------------------------------------
    def poll(self, wait: float) -> None:
        """Read every rank's heartbeat, CPU time and new event chunks (raises SeatLost once the seat is gone)."""
        time.sleep(min(wait, TICK))
        if not self.holds_seat():
            raise SeatLost
        n = len(self.watches)
        keys = [k for r in range(n) for k in (f"hb/{r}", f"cpu/{r}", f"evn/{r}")]
        values = [int(v) for v in self.store.multi_get(keys)]
        now = time.monotonic()
        fetch = []
        for w in self.watches:
            hb, cpu, chunks = values[3 * w.rank : 3 * w.rank + 3]
            w.cpu = cpu / 1e6
            if hb != w.hb:
                w.hb, w.hb_seen = hb, now
            fetch += [(w, f"ev/{w.rank}/{k}") for k in range(w.chunks, chunks)]
            w.chunks = max(w.chunks, chunks)
        if fetch:
            for (w, _), chunk in zip(fetch, self.store.multi_get([key for _, key in fetch]), strict=True):
                w.feed(chunk, now)

    def terminating(self) -> float | None:
        """Judge time of the first "terminated" event (torchrun's agent is stopping the ranks), or None."""
        times = [w.terminated for w in self.watches if w.terminated is not None]
        return min(times) if times else None

    # -- the judge's view (Observer) -------------------------------------------------------
    def since_start(self, t: float) -> float:
        """An event's wall-clock time in seconds since rank 0's start."""
        return t - self.t0_wall

    def dead(self, i: int, now: float) -> bool:
        """A started rank whose heartbeat stopped."""
        return self.watches[i].dead(now, self.terminating() is not None)

    def failures_seen(self, now: float) -> list[float]:
        """When ranks' "failed" events were seen, and when dead ranks last beat."""
        times = [w.failed_seen for w in self.watches if w.failed_seen is not None]
        return times + [w.hb_seen for w in self.watches if self.dead(w.rank, now)]

    def cpu(self, i: int, main: bool = False) -> float | None:
        """CPU seconds, as the rank last published them (its main thread's alone: unknown)."""
        return None if main else self.watches[i].cpu

    def stop_requested(self, now: float) -> StopReason | None:
        """TERMINATED once torchrun's agent has been stopping the ranks for :data:`TERM_GRACE`."""
        term = self.terminating()
        return StopReason.TERMINATED if term is not None and now - term >= TERM_GRACE else None

    def collect_stacks(self, indices: list[int]) -> None:
        """Ask the given ranks (through the store) to dump their main thread's stack; wait for the answers.

        A rank's watchdog answers on its next heartbeat: the wait ends once every rank asked has answered or died
        (its heartbeat stopped, :meth:`StoreRankWatch.dead`), under :data:`~ddpfaults.judge.live.loop.ANSWER_GUARD`.
        """
        indices = [i for i in indices if self.watches[i].events]
        asked = {i: self.store.add(f"stackreq/{i}", 1) for i in indices}
        for i in asked:
            self.watches[i].stack = None  # an answer that does not come in time leaves it unknown, never stale
        deadline = time.monotonic() + loop.ANSWER_GUARD
        while asked and time.monotonic() < deadline:
            time.sleep(TICK / 5)
            keys = [k for i in asked for k in (f"stackn/{i}", f"hb/{i}")]
            values = [int(v) for v in self.store.multi_get(keys)]
            now, answered = time.monotonic(), []
            for (i, n), served, hb in zip(list(asked.items()), values[::2], values[1::2], strict=True):
                w = self.watches[i]
                if hb != w.hb:
                    w.hb, w.hb_seen = hb, now
                if served >= n:
                    answered.append(i)
                elif self.dead(i, now):
                    del asked[i]
            if answered:
                for i, stack in zip(answered, self.store.multi_get([f"stack/{i}" for i in answered]), strict=True):
                    self.watches[i].stack = stack.decode(errors="replace")
                    self.answered.add(i)
                    del asked[i]

    def collect_flight_records(self, indices: list[int]) -> None:
        """A stack request is also a flight-recorder request (each rank answers with both): ask the ranks that
        have not answered one yet."""
        self.collect_stacks([i for i in indices if i not in self.answered])

    def flight_record(self, i: int) -> dict | None:
        """The dump rank ``i`` set in the store at its end or with its last stack (None: none, or empty)."""
        if not self.store.check([f"fr/{i}"]):
            return None
        data = self.store.multi_get([f"fr/{i}"])[0]
        return pickle.loads(data) if data else None

    def reported(self, i: int) -> dict | None:
        """The result the rank set in the store before its end event."""
        if not self.watches[i].ended:
            return None
        return pickle.loads(self.store.multi_get([f"res/{i}"])[0])

    def death(self, i: int, reason: StopReason, now: float):
        """A rank whose heartbeat stopped (or that never beat while the agent tore the world down)."""
        w = self.watches[i]
        if not (self.dead(i, now) or (not w.hb and reason == StopReason.TERMINATED)):
            return None
        output = w.local_output()
        stack = None
        if "Fatal Python error" in output and w.main_ident:  # faulthandler's dump: where it died
            stack = main_thread(output.split("Fatal Python error", 1)[1], w.main_ident)
        return _death_text(w, output), output, stack, round(w.hb_seen - self.t0, 6) if w.hb else None

    def describe(self, i: int) -> dict:
        """pid and the timeline (events are wall-clock: shown as seconds since rank 0's start)."""
        w = self.watches[i]
        return dict(
            pid=w.pid, exitcode=None, output="", events=[{**e, "t": round(e["t"] - self.t0_wall, 6)} for e in w.events]
        )


def judge_store_world(store, *, spec: RunSpec, t0_wall: float, holds_seat, **about) -> WorldResult | None:
    """Watch and judge the world through ``store`` (with its preemption, as the local launcher's); None if another
    rank took the judge's seat meanwhile."""
    world = StoreWorld(store, spec=spec, t0_wall=t0_wall, holds_seat=holds_seat)
    try:
        reason = loop.watch(world, spec)
        result = loop.judge(world, spec, reason, launcher="torchrun", **about)
    except SeatLost:
        return None
    return dataclasses.replace(result, preemption=recovery.preemption(result))


def _death_text(w: StoreRankWatch, output: str) -> str:
    """``died without reporting ...: <the most telling line it printed>; its last event: <a fault>``."""
    last = next((e for e in reversed(w.events) if e["k"] != "terminated"), None)
    signal_name = next((name for marker, name in _FATAL_SIGNALS if marker in output), None)
    if last is not None and last["k"] == "fault" and last.get("signal"):
        signal_name = last["signal"]  # the rank's own fault killed it; the fault's event says so before the kill
    if signal_name:
        text = f"was killed by {signal_name}"
    elif not w.hb:
        text = "died while starting, without reporting (torchrun's log has its exit code)"
    else:
        text = "died without reporting: its heartbeat stopped (torchrun's log has its exit code or signal)"
    line = telling_line(output)
    if line:
        text += f": {line}"
    if last is not None and last["k"] == "fault":
        text += f"; its last event: {last['fault']} {last['how']}"
    return text


#: faulthandler's first line for a fatal signal, in a dead rank's copied stderr
_FATAL_SIGNALS = (
    ("Fatal Python error: Aborted", "SIGABRT"),
    ("Fatal Python error: Segmentation fault", "SIGSEGV"),
    ("Fatal Python error: Bus error", "SIGBUS"),
)
