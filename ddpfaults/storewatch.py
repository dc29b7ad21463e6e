"""The world seen through the torch.distributed store: the rank-side event sink and the judge.

Under torchrun no parent process sees every rank, so each rank publishes what the local launcher
reads from its files (events, heartbeat, CPU time, result, its stack on request) as keys of one
store. One rank, the *judge* (rank 0, unless it died), reads them all and judges the world with the
local engine's pure functions (:mod:`ddpfaults.verdict`) and the same rules: a world ends when every
rank finished, failed or died; it is hung when nothing moved for ``stall`` seconds and every live
rank waits on its peers; ``timeout`` is the hard cap. The store keys, under the run's prefix:

- ``t0``: the world's start (rank 0's wall clock); ``judge``: the rank holding the judge's seat;
  ``verdict``: ``0`` pending, then ``1`` matched the expectation, ``2`` did not, ``3`` the judge failed;
- ``hb/R``, ``cpu/R``: rank R's heartbeat counter and CPU time (microseconds), every :data:`TICK`;
- ``evn/R``, ``ev/R/K``: how many event chunks rank R published, and chunk K (JSON lines);
- ``res/R``: rank R's pickled result, set before its ``finished`` / ``failed`` event;
- ``stackreq/R``, ``stackn/R``, ``stack/R``: stack dumps asked of rank R, answered, the last dump.

Event times are wall-clock seconds (ranks may sit on different machines); reports show them as
seconds since ``t0``.
"""

from __future__ import annotations

import json
import os
import pickle
import socket
import threading
import time

from .results import RankResult, RankState, WorldResult
from .verdict import first_divergence, is_waiting_stack, mark_collateral, root_cause, world_outcome
from .watch import RankWatch, frame_text, is_busy, tail, telling_line
from .world import PEER_EXIT_GRACE, REASONS as ENGINE_REASONS

TICK = 0.05  # seconds between a rank's heartbeats, and between the judge's looks at the store
DEAD_AFTER = 3.0  # a started rank whose heartbeat stops this long died (a stuck GIL can starve it ~1 s)
DEAD_AFTER_TERM = 0.5  # ... once torchrun's agent is stopping the ranks (it only does when a rank exited)
TERM_GRACE = PEER_EXIT_GRACE  # after the agent's first SIGTERM, the judge waits this long for reports
STACK_WAIT = 1.0  # seconds to wait for the ranks' answers to a stack dump request

REASONS = {
    **ENGINE_REASONS,
    "terminated": "torchrun's agent began stopping the ranks (a rank process exited abnormally, or torchrun "
                  "was interrupted)",
}


def rank_keys(rank: int) -> list[str]:
    """The counter keys of ``rank`` that must exist before anyone reads them (created with ``add(key, 0)``)."""
    return [f"hb/{rank}", f"cpu/{rank}", f"evn/{rank}", f"stackreq/{rank}", f"stackn/{rank}"]


def ensure_keys(store, keys) -> None:
    """Create missing counter keys as ``0`` (``add`` never blocks; ``get`` of a missing key would)."""
    for key in keys:
        store.add(key, 0)


class StoreEventLog:
    """The rank-side event sink: :class:`~ddpfaults.context.EventLog`'s ``emit``, published to the store.

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
        """Record one event stamped with the wall clock (published now if its kind is urgent)."""
        fields["k"] = kind
        fields["t"] = time.time()
        line = json.dumps(fields, default=str) + "\n"
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
    """The judge's view of one rank: :class:`~ddpfaults.watch.RankWatch` fed from store chunks, plus liveness."""

    def __init__(self, rank: int):
        super().__init__(rank, "")
        self.chunks = 0  # event chunks consumed
        self.hb = None  # last heartbeat counter seen (0: never beat)
        self.hb_seen = None  # judge clock when it last changed
        self.cpu = None  # CPU seconds, as last published
        self.pid = self.host = self.output = self.main_ident = None
        self.terminated = None  # judge clock when its "terminated" event (the agent's signal) was seen
        self.failed_seen = None  # judge clock when its "failed" event was seen

    def feed(self, chunk: bytes, now: float) -> None:
        """Apply one chunk of JSON-lines events, seen at judge time ``now``."""
        lines = [line for line in chunk.split(b"\n") if line.strip()]
        for line in lines:
            event = json.loads(line)
            self._apply(event)
            kind = event["k"]
            if kind == "start":
                self.pid, self.host, self.output = event.get("pid"), event.get("host"), event.get("output")
                self.main_ident = event.get("main_thread")
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


class Judge:
    """Gather every rank's progress from the store and judge the world as the local launcher does.

    ``settings`` holds stall, timeout, peer_failure, backend, seed, faults, function and replay;
    ``holds_seat()`` is asked every tick, and :meth:`run` gives up (returns None) once it is False.
    """

    def __init__(self, store, *, world_size: int, settings: dict, t0_wall: float, holds_seat=lambda: True):
        self.store = store
        self.n = world_size
        self.s = settings
        self.holds_seat = holds_seat
        self.t0_wall = t0_wall
        self.t0 = t0_wall - (time.time() - time.monotonic())  # the world's start on this process's monotonic clock
        self.watches = [StoreRankWatch(r) for r in range(world_size)]
        ensure_keys(store, [k for r in range(world_size) for k in rank_keys(r)])

    # -- gathering --------------------------------------------------------------------------
    def poll(self) -> None:
        """Read every rank's heartbeat, CPU time and new event chunks."""
        keys = [k for r in range(self.n) for k in (f"hb/{r}", f"cpu/{r}", f"evn/{r}")]
        values = [int(v) for v in self.store.multi_get(keys)]
        now = time.monotonic()
        fetch = []
        for w in self.watches:
            hb, cpu, chunks = values[3 * w.rank: 3 * w.rank + 3]
            w.cpu = cpu / 1e6
            if hb != w.hb:
                w.hb, w.hb_seen = hb, now
            fetch += [(w, f"ev/{w.rank}/{k}") for k in range(w.chunks, chunks)]
            w.chunks = max(w.chunks, chunks)
        if fetch:
            for (w, _), chunk in zip(fetch, self.store.multi_get([key for _, key in fetch])):
                w.feed(chunk, now)

    def terminating(self) -> float | None:
        """Judge time of the first "terminated" event (torchrun's agent is stopping the ranks), or None."""
        times = [w.terminated for w in self.watches if w.terminated is not None]
        return min(times) if times else None

    def live(self, now: float) -> list[int]:
        """Ranks still running their function (not ended, not dead)."""
        terminating = self.terminating() is not None
        return [w.rank for w in self.watches if not w.ended and not w.dead(now, terminating)]

    # -- deciding -----------------------------------------------------------------------------
    def run(self) -> WorldResult | None:
        """Watch until the world ended, stalled, timed out or is being torn down; return its result."""
        last_assessed = 0.0
        while True:
            if not self.holds_seat():
                return None
            self.poll()
            now = time.monotonic()
            reason, live = None, self.live(now)
            term = self.terminating()
            if not live:
                reason = "ended"
            elif now - self.t0 >= self.s["timeout"]:
                reason = "timeout"
            elif term is not None and now - term >= TERM_GRACE:
                reason = "terminated"
            else:
                quiet = now - max(w.last_progress for w in self.watches)
                if quiet >= self.s["stall"] and now - last_assessed >= min(self.s["stall"] / 4, 0.5):
                    last_assessed = now
                    if not self._recent_death(now) and self._all_blocked(now, live):
                        reason = "stall"
            if reason is not None:
                if reason in ("timeout", "terminated"):
                    self.collect_stacks(live)
                return self.judge(reason, time.monotonic())
            time.sleep(TICK)

    def _recent_death(self, now: float) -> bool:
        """In exit mode gloo needs a moment to tell the peers of a failed rank; don't call that a hang yet."""
        if self.s["peer_failure"] != "exit":
            return False
        terminating = self.terminating() is not None
        times = [w.failed_seen for w in self.watches if w.failed_seen is not None]
        times += [w.hb_seen for w in self.watches if w.dead(now, terminating)]
        return bool(times) and now - max(times) < PEER_EXIT_GRACE

    def _all_blocked(self, now: float, live: list[int]) -> bool:
        """True if every live rank waits on its peers (traced collective, or a waiting stack and no CPU)."""
        unsure = []
        for i in live:
            w = self.watches[i]
            if not w.events:
                return False  # still starting (importing torch, connecting)
            if w.waiting_in() is not None:
                continue
            if is_busy(w.cpu, w.cpu_at_progress, w.last_progress, now):
                return False  # computing: slow, not hung
            unsure.append(i)
        if unsure:
            self.collect_stacks(unsure)
            if not all(is_waiting_stack(self.watches[i].stack) for i in unsure):
                return False
        self.collect_stacks([i for i in live if i not in unsure])
        return True

    def collect_stacks(self, indices: list[int], wait: float = STACK_WAIT) -> None:
        """Ask the given ranks (through the store) to dump their main thread's stack; wait for the answers."""
        indices = [i for i in indices if self.watches[i].events]
        asked = {i: self.store.add(f"stackreq/{i}", 1) for i in indices}
        deadline = time.monotonic() + wait
        while asked and time.monotonic() < deadline:
            time.sleep(TICK / 5)
            answered = [i for i, n in zip(asked, self.store.multi_get([f"stackn/{i}" for i in asked]))
                        if int(n) >= asked[i]]
            if answered:
                for i, stack in zip(answered, self.store.multi_get([f"stack/{i}" for i in answered])):
                    self.watches[i].stack = stack.decode(errors="replace")
                    del asked[i]

    # -- judging ------------------------------------------------------------------------------
    def _wall(self, judge_time: float) -> float:
        """Seconds since the world's start of a time on this process's monotonic clock."""
        return round(judge_time - self.t0, 6)

    def _rank_result(self, w: StoreRankWatch, reason: str, now: float) -> RankResult:
        terminating = self.terminating() is not None
        res = RankResult(rank=w.rank, state=RankState.RUNNING, pid=w.pid, last_step=w.step, collectives=w.collectives,
                         fired=w.fired, output="", exitcode=None, stack=None,
                         events=[{**e, "t": round(e["t"] - self.t0_wall, 6)} for e in w.events])
        if w.ended:
            reported = pickle.loads(self.store.multi_get([f"res/{w.rank}"])[0])
            if reported["error"] is None:
                res.state = RankState.FINISHED
                try:
                    res.value = pickle.loads(reported["value"])
                except Exception as exc:  # noqa: BLE001 - a value this process cannot rebuild is shown, not fatal
                    res.value = f"<unpicklable here: {type(exc).__name__}: {exc}>"
                res.where = "finished; waiting for the verdict"
            else:
                res.state = RankState.RAISED
                res.error, res.traceback, res.site = reported["error"], reported["traceback"], reported["site"]
                failed = [e["t"] for e in w.events if e["k"] == "failed"]
                res.failed_at = round(failed[0] - self.t0_wall, 6) if failed else None
                res.where = ("raised; lingering" if self.s["peer_failure"] == "linger"
                             else "raised; peer connections closed, waiting for the verdict")
        elif w.dead(now, terminating) or (not w.hb and reason == "terminated"):
            res.state, res.output = RankState.DIED, w.local_output()
            res.error = _death_text(w, res.output)
            res.failed_at = self._wall(w.hb_seen) if w.hb else None
            if "Fatal Python error" in res.output and w.main_ident:  # faulthandler's dump: where it died
                from .launch import main_thread_stack

                res.stack = main_thread_stack(res.output.split("Fatal Python error", 1)[1], w.main_ident)
                res.where = f"died in {frame_text(res.stack)}"
        elif not w.events:
            res.where = "starting (no event yet)"
        else:
            waiting = w.waiting_in()
            if waiting is not None:
                res.state, res.where = RankState.BLOCKED, f"in {waiting.describe()}"
            elif is_waiting_stack(w.stack):
                res.state, res.where = RankState.BLOCKED, f"untraced wait: {frame_text(w.stack)}"
            else:
                res.where = frame_text(w.stack)
            res.stack = w.stack
        return res

    def judge(self, reason: str, now: float) -> WorldResult:
        """The world's result, from the verdict functions the local engine uses."""
        ranks = [self._rank_result(w, reason, now) for w in self.watches]
        mark_collateral(ranks)
        divergence = first_divergence(ranks)
        root_rank, cause = root_cause(ranks, divergence, reason)
        events = [{"k": "verdict", "t": self._wall(now), "reason": reason}]
        if reason == "stall":
            last = max(w.last_progress for w in self.watches)
            events.insert(0, {"k": "stall", "t": self._wall(last), "window": self.s["stall"]})
        return WorldResult(
            outcome=world_outcome(ranks, reason), ranks=ranks, root_cause=cause, root_rank=root_rank,
            reason=REASONS[reason].format(**self.s), elapsed=now - self.t0, world_size=self.n, events=events,
            seed=self.s["seed"], backend=self.s["backend"], peer_failure=self.s["peer_failure"],
            start_method="torchrun", stall=self.s["stall"], timeout=self.s["timeout"],
            divergence=divergence.describe() if divergence else None, faults=[repr(f) for f in self.s["faults"]],
            fired=[f for w in self.watches for f in w.fired], function=self.s["function"], replay=self.s["replay"],
        )


def _death_text(w: StoreRankWatch, output: str) -> str:
    """``died without reporting ...: <the most telling line it printed>; its last event: <a fault>``."""
    last = next((e for e in reversed(w.events) if e["k"] != "terminated"), None)
    signal_name = next((name for marker, name in _FATAL_SIGNALS if marker in output), None)
    if last is not None and last["k"] == "fault" and str(last.get("how", "")).startswith("SIGKILLed"):
        signal_name = "SIGKILL"  # the rank's own fault killed it; the fault's event says so before the kill
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
_FATAL_SIGNALS = (("Fatal Python error: Aborted", "SIGABRT"), ("Fatal Python error: Segmentation fault", "SIGSEGV"),
                  ("Fatal Python error: Bus error", "SIGBUS"))
