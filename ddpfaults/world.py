"""The launcher: start N rank processes, watch them, judge the world, leave nothing behind."""

from __future__ import annotations

import math
import multiprocessing
import os
import pickle
import shutil
import signal
import sys
import tempfile
import time

from . import errors, pool
from .faults import check_faults
from .rank import Job
from .results import RankResult, RankState, WorldResult
from .verdict import first_divergence, is_waiting_stack, mark_collateral, root_cause, world_outcome
from .watch import RankWatch, cpu_seconds, frame_text, is_busy, main_thread, tail, telling_line

BACKENDS = ("gloo",)
START_METHODS = ("forkserver", "spawn", "fork")
PEER_FAILURES = ("exit", "linger")
POLL_MIN, POLL_MAX = 0.005, 0.05  # seconds between looks at the ranks: often while busy, less when quiet
PEER_EXIT_GRACE = 2.0  # gloo needs ~1-1.5 s to tell peers that a rank exited ("Connection closed by peer")


def run_world(
    fn,
    *,
    world_size: int,
    faults=(),
    args=(),
    kwargs=None,
    timeout: float = 60.0,
    stall: float = 2.0,
    seed: int = 0,
    backend: str = "gloo",
    peer_failure: str = "exit",
    start_method: str = "forkserver",
    threads: int = 1,
    reuse: bool | None = None,
) -> WorldResult:
    """Run ``fn(ctx, *args, **kwargs)`` in ``world_size`` real rank processes and judge the world.

    ``timeout`` is the hard wall-clock cap; ``stall`` the window without progress after
    which a world whose live ranks all wait on their peers is judged hung.
    ``peer_failure="exit"`` lets a failed rank exit (gloo-native: peers see "Connection
    closed by peer"); ``"linger"`` keeps it alive with its sockets open (NCCL-like: peers hang).
    ``reuse`` runs on a warm world of the same shape if one is pooled, and pools this one
    if it stays healthy (default: on, unless the environment sets ``DDPFAULTS_REUSE=0``).
    """
    _validate(world_size, timeout, stall, backend, peer_failure, start_method, seed, threads)
    faults = check_faults(faults, world_size)
    payload = _pickle_payload(fn, args, kwargs or {})
    if reuse is None:
        reuse = os.environ.get("DDPFAULTS_REUSE", "1").strip().lower() not in ("0", "false", "no", "off")
    world = _World(fn, payload, faults, world_size=world_size, timeout=float(timeout), stall=float(stall),
                   seed=seed, backend=backend, peer_failure=peer_failure, start_method=start_method, threads=threads,
                   reuse=bool(reuse), kwargs_repr=repr(dict(kwargs)) if kwargs else "")
    return world.run()


def _validate(world_size, timeout, stall, backend, peer_failure, start_method, seed, threads) -> None:
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise errors.InvalidWorldSize(f"world_size must be an int >= 1, got {world_size!r}")
    for name, value in (("timeout", timeout), ("stall", stall)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or math.isinf(value):
            raise errors.InvalidTimeout(f"{name} must be a positive number of seconds, got {value!r}")
    if stall >= timeout:
        raise errors.InvalidTimeout(f"stall ({stall!r} s) must be shorter than timeout ({timeout!r} s)")
    if backend not in BACKENDS:
        raise errors.UnknownBackend(f"backend {backend!r} is not supported here; use one of {BACKENDS}")
    if peer_failure not in PEER_FAILURES:
        raise errors.UnknownPeerFailure(f"peer_failure must be one of {PEER_FAILURES}, got {peer_failure!r}")
    if start_method not in START_METHODS:
        raise errors.UnknownStartMethod(f"start_method must be one of {START_METHODS}, got {start_method!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise errors.ConfigError(f"seed must be an int, got {seed!r}")
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise errors.ConfigError(f"threads must be an int >= 1, got {threads!r}")


def _pickle_payload(fn, args, kwargs) -> bytes:
    if not callable(fn):
        raise errors.FunctionNotRunnable(f"fn must be a callable, got {fn!r}")
    qualname = getattr(fn, "__qualname__", repr(fn))
    if "<lambda>" in qualname or "<locals>" in qualname:
        raise errors.FunctionNotRunnable(
            f"fn {qualname!r} cannot run in a rank process: a lambda or a function defined inside another "
            f"function cannot be pickled by reference; define it at module level"
        )
    try:
        return pickle.dumps((fn, tuple(args), dict(kwargs)))
    except Exception as exc:
        raise errors.FunctionNotRunnable(
            f"fn {qualname!r} or its args cannot be pickled for the rank processes: {type(exc).__name__}: {exc}"
        ) from None


def describe_function(fn) -> str:
    """``path/to/file.py:name`` (or ``module:name``) for reports and replay commands."""
    module = sys.modules.get(getattr(fn, "__module__", ""), None)
    path = getattr(module, "__file__", None)
    name = getattr(fn, "__qualname__", repr(fn))
    if path:
        rel = os.path.relpath(path)
        return f"{path if rel.startswith('..') else rel}:{name}"
    return f"{getattr(fn, '__module__', '?')}:{name}"


class _World:
    """One run on a world: owns a job dir and (unless it goes back to the pool) the rank processes."""

    def __init__(self, fn, payload, faults, **settings):
        self.fn = fn
        self.payload = payload
        self.faults = faults
        self.s = settings
        self.n = settings["world_size"]
        self.ranks: pool.RankSet | None = None
        self.watches: list[RankWatch] = []
        self.dir = None
        self.warm = False

    @property
    def procs(self) -> list:
        return self.ranks.procs

    # -- life cycle ---------------------------------------------------------------------
    def run(self) -> WorldResult:
        """Start (or reuse), watch, judge; then pool the world if healthy, else kill every rank."""
        previous = _raise_on_sigterm()
        keep = False
        try:
            self._start()
            reason = self._watch()
            result = self._judge(reason)
            keep = self.s["reuse"] and self._reusable(result)
            if not keep:
                alive = self._live()
                self.ranks.close()
                for i in alive:
                    result.ranks[i].events.append({"k": "killed", "t": round(time.monotonic() - self.t0, 6)})
            result.reused = keep
            return result
        finally:
            if self.ranks is not None:
                if keep:
                    pool.give_back(self.ranks)
                else:
                    self.ranks.close()
            for w in self.watches:
                w.close()
            if self.dir is not None:
                shutil.rmtree(self.dir, ignore_errors=True)
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)

    def _start(self) -> None:
        key = (self.n, self.s["backend"], self.s["start_method"], self.s["threads"])
        self.ranks = pool.take(key) if self.s["reuse"] else None
        self.warm = self.ranks is not None
        if self.ranks is None:
            self.ranks = pool.RankSet(world_size=self.n, backend=self.s["backend"], start_method=self.s["start_method"],
                                      threads=self.s["threads"], timeout=self.s["timeout"], warm=self.s["reuse"])
        self.dir = tempfile.mkdtemp(prefix="job-", dir=self.ranks.dir)  # inside: a rank outliving us removes it
        shared = os.path.join(self.dir, "shared")
        os.mkdir(shared)
        fn_module = getattr(self.fn, "__module__", "__main__")
        job = Job(job_dir=self.dir, shared_dir=shared, seed=self.s["seed"], peer_failure=self.s["peer_failure"],
                  payload=self.payload, fn_module=fn_module,
                  fn_file=getattr(sys.modules.get(fn_module), "__file__", None), faults=self.faults,
                  env=dict(os.environ))
        self.watches = [RankWatch(r, self.dir) for r in range(self.n)]
        self.t0 = time.monotonic()
        if self.warm:
            self.ranks.send(job)
        else:
            self.ranks.start(job, hide_main=fn_module != "__main__")

    def _reusable(self, result: WorldResult) -> bool:
        """Only a clean, fault-free, completed world whose every rank still takes jobs goes back to the pool."""
        return (
            result.outcome == "completed" and not self.faults and self.ranks.warm
            and len(self._live()) == self.n and all(w.leftovers == [] for w in self.watches)
        )

    # -- watching -----------------------------------------------------------------------
    def _watch(self) -> str:
        """Return why watching stopped: 'ended' (no rank left running), 'stall' or 'timeout'."""
        sentinels = {p.sentinel: i for i, p in enumerate(self.procs)}
        last_assessed = 0.0
        while True:
            quiet = time.monotonic() - max(w.last_progress for w in self.watches)
            ready = multiprocessing.connection.wait(list(sentinels), timeout=min(POLL_MAX, max(POLL_MIN, quiet / 20)))
            now = time.monotonic()
            for s in ready:
                i = sentinels.pop(s)
                self.procs[i].join(timeout=1)
                self.watches[i].exit_time = now
                self.watches[i].last_progress = now
                self.watches[i].events.append({"k": "exited", "t": now, "code": self.procs[i].exitcode})
            for w, p in zip(self.watches, self.procs):
                w.read(p.pid if p.exitcode is None else None)
            if all(w.ended or p.exitcode is not None for w, p in zip(self.watches, self.procs)):
                return "ended"
            if now - self.t0 >= self.s["timeout"]:
                self._collect_stacks(self._live())
                return "timeout"
            quiet = now - max(w.last_progress for w in self.watches)
            if quiet >= self.s["stall"] and now - last_assessed >= min(self.s["stall"] / 4, 0.5):
                last_assessed = now
                if self._recent_death(now) is False and self._all_blocked(now):
                    return "stall"

    def _live(self) -> list[int]:
        return self.ranks.live()

    def _recent_death(self, now: float) -> bool:
        """In exit mode, gloo needs a moment to tell the peers of a dead rank; don't call that a hang yet."""
        if self.s["peer_failure"] != "exit":
            return False
        deaths = [w.exit_time for w in self.watches if w.exit_time is not None]
        return bool(deaths) and now - max(deaths) < PEER_EXIT_GRACE

    def _all_blocked(self, now: float) -> bool:
        """True if every live rank is waiting on its peers (or done and waiting for the verdict)."""
        unsure = []
        for i in self._live():
            w = self.watches[i]
            if not w.events:
                return False  # still starting (importing torch...): busy, and not yet able to dump its stack
            if w.ended or w.waiting_in() is not None:
                continue
            if is_busy(cpu_seconds(self.procs[i].pid), w.cpu_at_progress, w.last_progress, now):
                return False  # computing: slow, not hung
            unsure.append(i)
        if unsure:
            self._collect_stacks(unsure)
            if not all(is_waiting_stack(self.watches[i].stack) for i in unsure):
                return False
        self._collect_stacks([i for i in self._live() if i not in unsure])  # the unsure ones were just dumped
        return True

    def _collect_stacks(self, indices: list[int], wait: float = 1.0) -> None:
        """Dump the Python stacks of the given live ranks (faulthandler on SIGUSR1) into their watches."""
        indices = [i for i in indices if self.watches[i].events]  # SIGUSR1 kills a rank before faulthandler is set
        sizes = {}
        for i in indices:
            w = self.watches[i]
            sizes[i] = os.path.getsize(w.stack_path) if os.path.exists(w.stack_path) else 0
            try:
                os.kill(self.procs[i].pid, signal.SIGUSR1)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait
        pending, seen = set(indices), {}
        while pending and time.monotonic() < deadline:
            time.sleep(0.01)
            for i in list(pending):
                size = os.path.getsize(self.watches[i].stack_path) if os.path.exists(self.watches[i].stack_path) else 0
                if size > sizes[i] and seen.get(i) == size:  # written, and unchanged for one poll
                    with open(self.watches[i].stack_path) as f:
                        f.seek(sizes[i])
                        self.watches[i].stack = main_thread(f.read())
                    pending.discard(i)
                seen[i] = size

    # -- judging ------------------------------------------------------------------------
    def _rank_result(self, i: int, reason: str) -> RankResult:
        w, proc = self.watches[i], self.procs[i]
        result_path = os.path.join(self.dir, f"rank{i}.result")
        reported = None
        if os.path.exists(result_path):
            with open(result_path, "rb") as f:
                reported = pickle.load(f)
        output = tail(os.path.join(self.dir, f"rank{i}.out"))
        res = RankResult(rank=i, state=RankState.RUNNING, pid=proc.pid, last_step=w.step, collectives=w.collectives,
                         fired=w.fired, output=output, exitcode=proc.exitcode, stack=None,
                         events=[{**e, "t": round(e["t"] - self.t0, 6)} for e in w.events])
        if reported is not None and reported["error"] is None:
            res.state = RankState.FINISHED
            res.value = pickle.loads(reported["value"])
        elif reported is not None:
            res.state = RankState.RAISED
            res.error, res.traceback, res.site = reported["error"], reported["traceback"], reported["site"]
            failed = [e["t"] for e in w.events if e["k"] == "failed"]
            res.failed_at = (failed[0] - self.t0) if failed else None
        elif proc.exitcode is not None:
            res.state = RankState.DIED
            res.error = _death_text(proc.exitcode, output)
            if "Fatal Python error" in output:  # faulthandler's dump on SIGABRT/SIGSEGV: where it died
                res.stack = main_thread(output.split("Fatal Python error", 1)[1])
                res.where = f"died in {frame_text(res.stack)}"
            # it died after its last event and before the launcher saw the exit: rank it by the earliest
            # possible time, so a peer's consequent error (seen before the exit was) is not taken for the cause
            died = [e["t"] for e in w.events if e["k"] != "exited"] or ([w.exit_time] if w.exit_time else [])
            res.failed_at = (max(died) - self.t0) if died else None
        else:
            waiting = w.waiting_in()
            if waiting is not None:
                res.state, res.where = RankState.BLOCKED, f"in {waiting.describe()}"
            elif is_waiting_stack(w.stack):
                res.state = RankState.BLOCKED
                res.where = f"untraced wait: {frame_text(w.stack)}"
            else:
                res.where = frame_text(w.stack)
            res.stack = w.stack
        if res.state in (RankState.FINISHED, RankState.RAISED) and proc.exitcode is None:
            lingering = "raised; lingering" if self.s["peer_failure"] == "linger" else "raised; exiting"
            res.where = "finished; waiting for the verdict" if res.state == RankState.FINISHED else lingering
        return res

    def _judge(self, reason: str) -> WorldResult:
        ranks = [self._rank_result(i, reason) for i in range(self.n)]
        mark_collateral(ranks)
        divergence = first_divergence(ranks)
        root_rank, cause = root_cause(ranks, divergence, reason)
        fired = [f for w in self.watches for f in w.fired]
        elapsed = time.monotonic() - self.t0
        events = [{"k": "verdict", "t": round(elapsed, 6), "reason": reason}]
        if reason == "stall":
            last = max(w.last_progress for w in self.watches) - self.t0
            events.insert(0, {"k": "stall", "t": round(last, 6), "window": self.s["stall"]})
        return WorldResult(
            outcome=world_outcome(ranks, reason), ranks=ranks, root_cause=cause, root_rank=root_rank,
            reason=REASONS[reason].format(**self.s), elapsed=elapsed, world_size=self.n, events=events,
            seed=self.s["seed"], backend=self.s["backend"], peer_failure=self.s["peer_failure"],
            start_method=self.s["start_method"], stall=self.s["stall"], timeout=self.s["timeout"],
            divergence=divergence.describe() if divergence else None, faults=[repr(f) for f in self.faults],
            fired=fired, function=describe_function(self.fn), warm=self.warm, kwargs=self.s["kwargs_repr"],
        )


def _raise_on_sigterm():
    """While a world runs, turn a default-handled SIGTERM into SystemExit so cleanup runs.

    Returns the handler to restore, or None when nothing was changed (not the main
    thread, or the application handles SIGTERM itself).
    """
    import threading

    if threading.current_thread() is not threading.main_thread():
        return None
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return None

    def terminate(signum, frame):
        raise SystemExit(128 + signum)

    return signal.signal(signal.SIGTERM, terminate)


REASONS = {
    "ended": "every rank finished or failed",
    "stall": "no progress for {stall:g} s and every live rank waiting on its peers",
    "timeout": "hard timeout of {timeout:g} s reached",
}


def _death_text(exitcode: int | None, output: str) -> str:
    """``was killed by SIGABRT: <the most telling line it printed>``."""
    if exitcode is not None and exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        text = f"was killed by {name}"
    else:
        text = f"exited with code {exitcode} without reporting"
    line = telling_line(output)
    return f"{text}: {line}" if line else text
