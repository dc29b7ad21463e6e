"""A torchrun rank's watchdog thread: heartbeat, events, stack dumps, the judge's seat, the verdict, the exit.

Exit codes: 0 the verdict matched the case's ``Expect``; 1 it did not (or the judge failed); 2 bad arguments
or environment; 3 the attempt crashed or hung and torchrun restarts the world (:mod:`ddpfaults.torchrun.restarts`);
128+N no verdict within :data:`HOLD_LIMIT` of the agent's signal N.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import traceback

from ddpfaults.torchrun.process import dump_main_stack
from ddpfaults.torchrun.restarts import EXIT_RESTART, RESTART
from ddpfaults.torchrun.store import DEAD_AFTER, DEAD_AFTER_TERM, TICK, ensure_keys

EXIT_MATCHED, EXIT_MISMATCHED, EXIT_CONFIG = 0, 1, 2
HOLD_LIMIT = 10.0  # seconds a rank stays up after torchrun's SIGTERM, waiting for the verdict
STORE_LOST = 10.0  # seconds of failing store calls after which a rank gives up and exits
HELD_SIGNALS = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}


class Watchdog(threading.Thread):
    """A rank's link to the store: heartbeat, events, stack dumps, the judge's seat, the verdict, the exit."""

    def __init__(self, store, env, events, start_judge, cleanup):
        """``env`` is the rank's TorchrunEnv; ``start_judge()`` starts a judge thread, ``cleanup()`` runs at exit."""
        super().__init__(name="ddpfaults-watchdog", daemon=True)
        self.store, self.env, self.events = store, env, events
        self.start_judge, self.cleanup = start_judge, cleanup
        self.judging = None  # the judge thread, while this rank holds the seat
        self.beats = self.served = 0
        self.seat, self.seat_hb, self.seat_seen = 0, None, time.monotonic()
        self.terminated_at = None

    def run(self) -> None:
        """Tick until the verdict (or a lost store, or the hold limit) ends the process."""
        last_ok = time.monotonic()
        try:
            while True:
                try:
                    self.tick()
                    last_ok = time.monotonic()
                except Exception as exc:  # noqa: BLE001 - the store may blip; give up only after STORE_LOST
                    if time.monotonic() - last_ok > STORE_LOST:
                        self.exit(EXIT_MISMATCHED, f"lost the store for {STORE_LOST:g} s: {exc}")
                if self.terminated_at is not None and time.monotonic() - self.terminated_at > HOLD_LIMIT:
                    self.exit(128 + signal.SIGTERM, f"no verdict {HOLD_LIMIT:g} s after torchrun's signal")
                time.sleep(TICK)
        except BaseException:  # noqa: BLE001 - a broken watchdog must not leave a rank running unseen
            traceback.print_exc()
            os._exit(EXIT_MISMATCHED)

    def tick(self) -> None:
        """One heartbeat: publish, read the verdict, the seat and stack requests, act on them."""
        me = self.env.rank
        self.beats += 1
        self.events.flush(self.store, [f"hb/{me}", f"cpu/{me}"], [str(self.beats), str(int(time.process_time() * 1e6))])
        verdict, seat, asked, seat_hb = (
            int(v) for v in self.store.multi_get(["verdict", "judge", f"stackreq/{me}", f"hb/{self.seat}"])
        )
        if verdict:
            if self.judging is not None:
                self.judging.join(timeout=30)  # it published the verdict as its last act
            self.exit({1: EXIT_MATCHED, RESTART: EXIT_RESTART}.get(verdict, EXIT_MISMATCHED))
        if asked > self.served:
            from ddpfaults.rank import flight  # torch is loaded by now

            self.store.set(f"fr/{me}", flight.dump() or b"")  # before the answer: the judge reads both after it
            self.store.multi_set([f"stack/{me}", f"stackn/{me}"], [dump_main_stack(), str(asked)])
            self.served = asked
        if seat != self.seat:
            ensure_keys(self.store, [f"hb/{seat}"])
            self.seat, self.seat_hb, self.seat_seen = seat, None, time.monotonic()
        elif seat_hb != self.seat_hb:
            self.seat_hb, self.seat_seen = seat_hb, time.monotonic()
        if seat == me:
            if self.judging is None:
                self.judging = self.start_judge()
        elif self._seat_holder_dead():
            won = self.store.compare_set("judge", str(seat), str(me)) == str(me).encode()
            if won:
                print(f"ddpfaults: rank {me} takes over judging: rank {seat} stopped heartbeating", file=sys.stderr)

    def _seat_holder_dead(self) -> bool:
        if not self.seat_hb and self.terminated_at is None:
            return False  # still starting
        limit = DEAD_AFTER_TERM if self.terminated_at is not None else DEAD_AFTER
        return time.monotonic() - self.seat_seen >= limit

    def on_signal(self, signum: int) -> None:
        """torchrun's agent (or a user) asked this rank to stop: record it, and hold on for the verdict."""
        if self.terminated_at is None:
            self.terminated_at = time.monotonic()
            self.events.emit("terminated", signal=signal.Signals(signum).name)

    def exit(self, code: int, message: str | None = None) -> None:
        """End the process now (from any thread): flush, clean up the node's shared dir, ``os._exit``."""
        if message:
            print(f"ddpfaults: rank {self.env.rank}: {message}", file=sys.stderr)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001
                pass
        self.cleanup()
        os._exit(code)


def hold_signals(watchdog: Watchdog) -> None:
    """The signal thread: every held signal goes to the watchdog instead of killing the rank."""
    while True:
        watchdog.on_signal(signal.sigwait(HELD_SIGNALS))
