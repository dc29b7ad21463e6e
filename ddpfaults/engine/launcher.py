"""The local launcher: start N rank processes, observe them through their files, judge, leave nothing behind."""

from __future__ import annotations

import dataclasses
import multiprocessing
import multiprocessing.connection
import os
import pickle
import shutil
import signal
import sys
import tempfile
import time
from typing import ClassVar

from ddpfaults import errors, events, jobfiles
from ddpfaults.engine import pool, restarts, world
from ddpfaults.engine.folders import check_cwd
from ddpfaults.faults import Plan, batches
from ddpfaults.judge.checks import recovery, resume
from ddpfaults.judge.live import loop
from ddpfaults.judge.live.observer import Observer
from ddpfaults.judge.live.watch import (
    RankWatch,
    cpu_seconds,
    demand_seconds,
    main_thread,
    read_dump,
    tail,
    telling_line,
)
from ddpfaults.judge.results import WorldResult
from ddpfaults.proc import tree
from ddpfaults.rank.main import Job, Runnable
from ddpfaults.replay import describe_function
from ddpfaults.spec import RunSpec, StopReason, check_call


def run_world(
    fn,
    *,
    world_size: int,
    faults=(),
    args=(),
    kwargs=None,
    spec: RunSpec | None = None,
    flight_recorder_dir: str | os.PathLike | None = None,
    require_faults_fire: bool = True,
    cwd: str | os.PathLike | None = None,
    **settings,
) -> WorldResult:
    """Run ``fn(ctx, *args, **kwargs)`` in ``world_size`` real rank processes and judge the world.

    ``settings`` are keywords naming fields of :class:`~ddpfaults.spec.RunSpec` (``docs/options.md``); those left
    out (or None) come from ``spec``, else the defaults (timeout 300 s, stall 2 s, start-up 300 s, seed 0, gloo,
    peer_failure exit, forkserver, 1 thread). ``timeout`` is the
    hard wall-clock cap, start-up included; ``stall`` the window without progress after which a world whose live
    ranks all wait on their peers is judged hung; ``startup`` an upper bound on start-up (the fork server importing
    torch, the ranks starting and joining the process group), within ``timeout``: a rendezvous still in progress
    or a rank still importing is never judged hung. ``peer_failure="exit"`` lets a failed rank exit (gloo-native:
    peers see
    "Connection closed by peer"); ``"linger"`` keeps it alive with its sockets open (NCCL-like: peers hang).
    ``reuse`` (default: on; ``DDPFAULTS_REUSE=0`` in the environment: off) runs a fault-free or data-only plan on a
    pooled warm world of its shape and pools this one if it stays healthy. ``flight_recorder_dir``: a folder for every
    rank's flight-recorder dump (``rank_0``, ``rank_1``...: the layout ``torch.distributed.flight_recorder`` reads).

    ``faults`` is a list of faults, validated (and refused with a :class:`~ddpfaults.errors.FaultError`) before
    any rank starts. A fault that never fires although a rank it targets finished its function normally raises
    :class:`~ddpfaults.errors.FaultNeverFired` after the world, carrying the result (``exc.result``); the
    result's ``unfired`` lists every fault that never fired. A fault whose ranks all raised, died or stalled
    first is not an error. ``require_faults_fire=False`` returns the result instead. ``cwd``: the ranks' working
    directory while ``fn`` runs (default: this process's).
    """
    target = FunctionTarget.of(fn, args=args, kwargs=kwargs, cwd=cwd)
    request = world.WorldRequest.of(
        target, faults, spec, flight_recorder_dir, require_faults_fire, world_size=world_size, **settings
    )
    return world.run(request)


@dataclasses.dataclass(frozen=True)
class FunctionTarget:
    """What a world's ranks run (:class:`~ddpfaults.engine.world.Target`): the :class:`~ddpfaults.rank.main.Runnable`
    every rank's job carries (the pickled ``(fn, args, kwargs)``, where ``fn``'s module lives, the working directory),
    and how reports name it (``function``, ``kwargs``, ``replay``, ``step_clock``). A rank function's attempts share
    ``ctx.shared_dir`` when it may restart or be run again for the resume check, and each attempt but the last warms
    up a standby; a script's attempt runs one of these, the script's runner
    (:class:`~ddpfaults.engine.scripts.ScriptRun`)."""

    call: ClassVar[str] = "run_world"  # the public call whose keywords :meth:`WorldRequest.of` takes
    settings: ClassVar[tuple | None] = None  # the settings it takes (None: every one)
    fixed: ClassVar[dict] = {}  # settings it always runs with

    runnable: Runnable
    function: str
    kwargs: str = ""
    replay: str | None = None
    step_clock: str = "ctx.step"

    @classmethod
    def of(cls, fn, *, args=(), kwargs=None, cwd=None) -> FunctionTarget:
        """``fn(ctx, *args, **kwargs)``, once ``fn`` is known to be importable by reference and to take them, and
        ``cwd`` a directory (the errors of bad input, before any rank starts)."""
        cwd = check_cwd(cwd, "run_world")
        fn_module = getattr(fn, "__module__", "__main__")
        file = getattr(sys.modules.get(fn_module), "__file__", None)
        return cls(
            runnable=Runnable(_pickle_payload(fn, args, kwargs), fn_module, file, cwd=cwd),
            function=describe_function(fn),
            kwargs=repr(dict(kwargs)) if kwargs else "",
        )

    def kept(self, spec: RunSpec):
        """The shared directory kept across the attempts of one run (None: one per attempt)."""
        return restarts.kept_dir("ddpfaults-shared-", spec.max_restarts > 0 or spec.check_resume)

    def attempt(self, request, plan: Plan, attempt: int, resume_watch: frozenset, kept) -> WorldResult:
        """One attempt on a world of local processes."""
        standby = attempt < request.spec.max_restarts
        world = LocalWorld(self, plan, request.spec, request.flight_recorder_dir, attempt, kept, standby, resume_watch)
        return world.run()


def _pickle_payload(fn, args, kwargs) -> bytes:
    """``(fn, args, kwargs)`` pickled for the ranks, once ``fn`` is known to be importable by reference and to take
    ``(ctx, *args, **kwargs)``."""
    if not callable(fn):
        raise errors.FunctionNotRunnable(f"fn must be a callable, got {fn!r}")
    qualname = getattr(fn, "__qualname__", repr(fn))
    if "<lambda>" in qualname or "<locals>" in qualname:
        raise errors.FunctionNotRunnable(
            f"fn {qualname!r} cannot run in a rank process: a lambda or a function defined inside another "
            f"function cannot be pickled by reference; define it at module level"
        )
    args, kwargs = check_call(fn, args, kwargs)
    try:
        return pickle.dumps((fn, args, kwargs))
    except Exception as exc:
        raise errors.FunctionNotRunnable(
            f"fn {qualname!r} or its args cannot be pickled for the rank processes: {type(exc).__name__}: {exc}"
        ) from None


class LocalWorld(Observer):
    """One run on a world of local processes: owns a job dir and (unless it goes back to the pool) the ranks."""

    def __init__(
        self,
        work: FunctionTarget,
        faults,
        spec: RunSpec,
        flight_recorder_dir=None,
        attempt=0,
        shared_dir=None,
        standby=False,
        resume_watch: frozenset = frozenset(),
    ):
        self.work, self.faults, self.spec = work, faults, spec
        self.resume_watch = resume_watch  # parameter digests entering a step where the capture records its state
        self.attempt = attempt  # the run of a restarted world
        self.standby = standby and spec.reuse and bool(self._acting())  # a restart may follow: see _start
        self.shared_dir = shared_dir  # a shared directory kept across attempts (None: one per job)
        self.ranks: pool.RankSet | None = None
        self.watches: list[RankWatch] = []
        self.dir = None
        self.warm = False
        self.sentinels: dict = {}
        self.flight_recorder_dir = os.fspath(flight_recorder_dir) if flight_recorder_dir is not None else None
        self.outputs: dict = {}  # rank -> the tail of its output, once read at the verdict
        self.fr_asked: dict = {}  # rank -> its dump's mtime when a dump was last asked of it

    @property
    def procs(self) -> list:
        """The rank processes, in rank order."""
        return self.ranks.procs

    # -- life cycle ---------------------------------------------------------------------
    def run(self) -> WorldResult:
        """Start (or reuse), watch, judge; then pool the world if healthy, else kill every rank."""
        previous = _raise_on_sigterm()
        keep = False
        try:
            self._start()
            reason = loop.watch(self, self.spec)
            verdict = loop.judge(
                self,
                self.spec,
                reason,
                plan=self.faults,
                function=self.work.function,
                warm=self.warm,
                kwargs=self.work.kwargs,
                replay=self.work.replay,
                step_clock=self.work.step_clock,
            )
            found = dict(
                preemption=recovery.preemption(verdict),
                resume_records=resume.read(self.dir, self.spec.world_size) if self.spec.check_resume else None,
            )
            if self.flight_recorder_dir is not None:
                found["flight_records"] = self._keep_flight_records(self.flight_recorder_dir)
            keep = self.spec.reuse and self._reusable(verdict)
            ranks = verdict.ranks
            if not keep:
                alive = self.ranks.live()
                self.ranks.close()
                killed = events.event("killed", t=round(time.monotonic() - self.t0, 6))
                ranks = [
                    dataclasses.replace(r, events=[*r.events, killed]) if i in alive else r for i, r in enumerate(ranks)
                ]
            return dataclasses.replace(verdict, ranks=ranks, reused=keep, **found)
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
        spec = self.spec
        take = spec.reuse and (self._acting().data_only or self.standby)  # a restarted world is never pooled again
        self.ranks = pool.take(pool.world_key(spec)) if take else None
        self.warm = self.ranks is not None
        if self.ranks is None:
            self.ranks = pool.RankSet.of(spec, warm=spec.reuse)
        self.dir = tempfile.mkdtemp(prefix="job-", dir=self.ranks.dir)  # inside: a rank outliving us removes it
        shared = self.shared_dir or os.path.join(self.dir, "shared")
        os.makedirs(shared, exist_ok=True)
        job = Job(
            job_dir=self.dir,
            shared_dir=shared,
            spec=spec,
            runnable=self.work.runnable,
            faults=self.faults,
            env=dict(os.environ),
            empty_batch_types=batches.registered(),
            attempt=self.attempt,
            resume_watch=self.resume_watch,
        )
        self.watches = [RankWatch(r, self.dir) for r in range(spec.world_size)]
        self.t0 = time.monotonic()
        if self.warm:
            self.ranks.send(job)
        else:
            hide_main = self.work.runnable.module != "__main__"
            self.ranks.start(job, hide_main=hide_main, deadline=self.t0 + spec.startup_limit)
        self.sentinels = {p.sentinel: i for i, p in enumerate(self.procs) if p.pid is not None}
        if self.standby:  # this world runs warm and is never pooled again; the next attempt takes a warmed-up one
            pool.standby(spec, hide_main=self.work.runnable.module != "__main__")

    def _acting(self) -> Plan:
        """The faults that act in this attempt."""
        return Plan(f for f in self.faults if f.attempt == self.attempt)

    def _reusable(self, result: WorldResult) -> bool:
        """Pool again a world :func:`~pool.keep` allows (a data-only plan, settled), its ranks up and clean."""
        return (
            pool.keep(self.ranks, self._acting(), result)
            and self.ranks.warm
            and len(self.ranks.live()) == self.spec.world_size
            and all(w.leftovers == [] for w in self.watches)
        )

    def _path(self, i: int, kind: str) -> str:
        """Rank ``i``'s file of ``kind`` (out, result, fr) in this job's directory."""
        return jobfiles.path(self.dir, i, kind)

    def _output(self, i: int) -> str:
        """The tail of rank ``i``'s captured output, read once per judgement."""
        if i not in self.outputs:
            self.outputs[i] = tail(self._path(i, "out"))
        return self.outputs[i]

    def _keep_flight_records(self, directory: str) -> str:
        """Copy every rank's flight-recorder dump into ``directory`` as ``rank_N`` (fr_trace's layout)."""
        os.makedirs(directory, exist_ok=True)
        for i in range(self.spec.world_size):
            source = self._path(i, "fr")
            if os.path.exists(source):
                shutil.copyfile(source, os.path.join(directory, f"rank_{i}"))
        return directory

    # -- the judge's view (Observer) -------------------------------------------------
    def poll(self, wait: float) -> None:
        """Wait for a rank to exit (at most ``wait`` s), then read every rank's new events."""
        ready = multiprocessing.connection.wait(list(self.sentinels), timeout=wait)
        now = time.monotonic()
        for s in ready:
            i = self.sentinels.pop(s)
            self.procs[i].join(timeout=1)
            w = self.watches[i]
            w.exit_time = w.last_progress = now
            w.events.append(events.event("exited", t=now, code=self.procs[i].exitcode))
        for w, p in zip(self.watches, self.procs, strict=True):
            w.read(None if w.exit_time is not None else p.pid)

    def dead(self, i: int, now: float) -> bool:
        """A rank whose exit a :meth:`poll` saw, and read the rank's events after: what it wrote before it exited
        (a fault that fired, then SIGKILLed the rank) is never missed."""
        return self.watches[i].exit_time is not None

    def exited(self, i: int) -> bool:
        """A rank whose process exited."""
        return self.procs[i].exitcode is not None

    def unstarted(self, i: int) -> bool:
        """A rank whose process was never started (see :class:`~ddpfaults.engine.pool.Unstarted`)."""
        return self.procs[i].pid is None

    def failures_seen(self, now: float) -> list[float]:
        """When rank processes were seen to exit; ``now`` for a rank that reported its failure and has not exited
        yet (gloo tells its peers only when the failed process is gone, which can take seconds under load)."""
        return [now if w.exit_time is None else w.exit_time for w in self.watches if w.exit_time or w.ended == "failed"]

    def cpu(self, i: int, main: bool = False) -> float | None:
        """CPU seconds (``main``: of its main thread alone) from /proc."""
        return cpu_seconds(self.procs[i].pid, main)

    def demand(self, i: int) -> float | None:
        """Its main thread's seconds on a core and in a run queue, from /proc."""
        return demand_seconds(self.procs[i].pid)

    def runnable(self, i: int, threads: bool = False) -> bool | None:
        """Its main thread (``threads``: any of its threads) running or waiting for a CPU (/proc state R)."""
        return tree.threads_runnable(self.procs[i].pid) if threads else tree.runnable(self.procs[i].pid)

    def collect_stacks(self, indices: list[int]) -> None:
        """Have the given live ranks dump their Python stacks (a request file their request thread polls) into their
        watches."""
        indices = [i for i in indices if self.watches[i].events]  # a rank without events has no request thread yet
        self._ask_flight_records(indices)  # the judge may need them next: ask in the same round
        sizes = {}
        for i in indices:
            w = self.watches[i]
            w.stack = None  # a dump that does not come in time leaves the stack unknown, never a stale one
            sizes[i] = os.path.getsize(w.stack_path) if os.path.exists(w.stack_path) else 0
            with open(jobfiles.request(w.stack_path), "w") as f:  # the rank's request thread dumps, holding the GIL
                f.write(str(time.monotonic()))
        seen: dict = {}

        def answered(i: int) -> bool:  # its dump written, and unchanged for one poll
            w = self.watches[i]
            size = os.path.getsize(w.stack_path) if os.path.exists(w.stack_path) else 0
            done, seen[i] = size > sizes[i] and seen.get(i) == size, size
            if done:
                with open(w.stack_path) as f:
                    f.seek(sizes[i])
                    w.stack = main_thread(f.read(), w.main_ident)
            return done

        self._await_answers(indices, answered)

    def _ask_flight_records(self, indices: list[int]) -> None:
        """Ask the given ranks for a flight-recorder dump (a request file their recorder thread polls)."""
        for i in indices:
            path = self._path(i, "fr")
            self.fr_asked[i] = _mtime(path)
            with open(jobfiles.request(path), "w") as f:
                f.write(str(time.monotonic()))

    def collect_flight_records(self, indices: list[int]) -> None:
        """Wait for the dumps of the given live ranks (asked with their stacks, or now)."""
        indices = [i for i in indices if self.watches[i].events]
        self._ask_flight_records([i for i in indices if i not in self.fr_asked])
        self._await_answers(indices, lambda i: _mtime(self._path(i, "fr")) != self.fr_asked[i])

    def _await_answers(self, indices: list[int], answered) -> None:
        """Poll until each of ``indices`` has ``answered(i)`` or its job is over, under
        :data:`~ddpfaults.judge.live.loop.ANSWER_GUARD`."""
        pending = set(indices)
        deadline = time.monotonic() + loop.ANSWER_GUARD
        while pending and time.monotonic() < deadline:
            time.sleep(0.005)
            pending = {i for i in pending if not self._job_over(i) and not answered(i)}

    def _job_over(self, i: int) -> bool:
        """Rank ``i`` exited or reported its job's end: its request thread has stopped, and no dump will come."""
        return self.procs[i].exitcode is not None or os.path.exists(self._path(i, "result"))

    def flight_record(self, i: int) -> dict | None:
        """The rank's last flight-recorder dump in this job's directory."""
        return read_dump(self._path(i, "fr"))

    def reported(self, i: int) -> dict | None:
        """The result file the rank wrote before its end event."""
        path = self._path(i, "result")
        if not os.path.exists(path):
            return None
        with open(path, "rb") as f:
            return pickle.load(f)

    def death(self, i: int, reason: StopReason, now: float):
        """An exited rank that wrote no result: its exit code or signal, and faulthandler's dump if it printed one."""
        proc, w = self.procs[i], self.watches[i]
        if proc.exitcode is None:
            return None
        output = self._output(i)
        stack = None
        if "Fatal Python error" in output:  # faulthandler's dump on SIGABRT/SIGSEGV: where it died
            stack = main_thread(output.split("Fatal Python error", 1)[1], w.main_ident)
        # it died after its last event and before the launcher saw the exit: rank it by the earliest
        # possible time, so a peer's consequent error (seen before the exit was) is not taken for the cause
        died = [e["t"] for e in w.events if e["k"] != "exited"] or ([w.exit_time] if w.exit_time else [])
        return _death_text(proc.exitcode, output), output, stack, (max(died) - self.t0) if died else None

    def describe(self, i: int) -> dict:
        """pid, exit code, output tail and the timeline of rank ``i``."""
        w = self.watches[i]
        return dict(
            pid=self.procs[i].pid,
            exitcode=self.procs[i].exitcode,
            output=self._output(i),
            events=[{**e, "t": round(e["t"] - self.t0, 6)} for e in w.events],
        )


def _mtime(path: str) -> int | None:
    try:
        return os.stat(path).st_mtime_ns
    except FileNotFoundError:
        return None


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
