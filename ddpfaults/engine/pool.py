"""Rank processes of a world, and the pool that keeps healthy worlds warm for the next run.

A warm world keeps its rank processes up with the process group initialised; the next
``run_world`` of the same world size, backend, start method and thread count sends its job
to them instead of starting new processes, if its plan is data-only (no fault, or only
faults that change the data a rank sees: ``EmptyBatch``, ``SchemaDrift``, ``UnevenInputs``).
Only a world whose last run completed under such a plan, whose ranks all reported no leftover
state (see ``rank.leftover_state``) and that :func:`settled` (no collective left unmatched) goes
back into the pool; anything else is killed. A plan with any other fault starts a world of its own (the
pooled one stays pooled) and never gives it back. The pool is per launcher process (so per
pytest-xdist worker) and is closed at exit.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import multiprocessing
import os
import pickle
import shutil
import sys
import tempfile
import threading
import time
import types
from multiprocessing import forkserver

from ddpfaults.engine import census
from ddpfaults.faults import Plan
from ddpfaults.judge.results import POINT_TO_POINT
from ddpfaults.proc import mp_private, tree
from ddpfaults.rank.forkserver import SIGNAL as forkserver_signal
from ddpfaults.rank.forkserver import probe as forkserver_probe
from ddpfaults.rank.forkserver import world_dir_prefix
from ddpfaults.rank.job import warm_up
from ddpfaults.rank.main import Job, RankConfig, Runnable, world_tmp
from ddpfaults.rank.main import main as rank_main

#: collectives a warm world's flight record may hold before the world is retired (killed, not pooled), where its
#: ranks cannot empty the record as a job starts (``flight.forget``: torch's symbols not found). torch keeps
#: every job's collectives in its ring buffer then; a rank writes only its job's (the judge reads no others), but
#: torch's dump still copies out the whole buffer, so each job's dump is slower than the last. The cost of each
#: choice, as measured: docs/measurements.md (the warm pool's record limit).
RECORD_LIMIT = 512
WARM_PG_TIMEOUT = 1800.0  # a warm group outlives any one run's timeout; the launcher, not gloo, finds hangs
#: imported once in the fork server, so ranks start with them loaded (DDP.__init__ and the first flight-recorder
#: dump import torch._dynamo: ~1 s of CPU per rank otherwise; FSDP2 and DCP ~1.5 s per rank); the first sets the
#: fork server up to keep, and at the launcher's death kill, whatever the ranks leave behind (see
#: ddpfaults.rank.forkserver); the last freezes what the others made, so no rank's collection walks it.
_FORKSERVER_PRELOAD = [
    "ddpfaults.rank.forkserver",
    "torch",
    "torch.distributed",
    "torch.nn.parallel",
    "torch._dynamo",
    "torch.distributed.fsdp",
    "torch.distributed.checkpoint",
    "ddpfaults.rank.main",
    "ddpfaults.rank.preload_done",
]


class RankSet:
    """The N processes of one world; with ``warm`` they take jobs over pipes, else they run one."""

    @classmethod
    def of(cls, spec, warm: bool) -> RankSet:
        """The ranks of a world of ``spec``'s shape (:func:`world_key`), its process group's timeout from its own."""
        shape = dict(world_size=spec.world_size, backend=spec.backend, start_method=spec.start_method)
        return cls(**shape, threads=spec.threads, timeout=spec.timeout, warm=warm)

    def __init__(self, *, world_size: int, backend: str, start_method: str, threads: int, timeout: float, warm: bool):
        self.key = (world_size, backend, start_method, threads)
        self.world_size = world_size
        self.start_method = start_method
        self.warm = warm
        self.dir = tempfile.mkdtemp(prefix=world_dir_prefix(os.getpid()))  # the fork server sweeps them if we die
        os.mkdir(world_tmp(self.dir))
        self.pg_timeout = max(timeout + 30.0, WARM_PG_TIMEOUT) if warm else timeout + 30.0
        self.backend = backend
        self.threads = threads
        self.procs: list = []
        self.conns: list = []
        self.runs = 0
        self.recorded = 0  # collectives in the ranks' flight records so far (the most any rank made)
        self.closed = False

    def start(self, job: Job, hide_main: bool, deadline: float) -> None:
        """Start the rank processes on their first job; ranks not started by ``deadline`` (monotonic) stay
        :class:`Unstarted` (the judge then finds start-up unfinished)."""
        ctx = multiprocessing.get_context(self.start_method)
        if self.start_method == "forkserver":
            if not fork_server_ready(deadline - time.monotonic()):
                self.procs = [Unstarted()] * self.world_size
                return
        for r in range(self.world_size):
            if time.monotonic() >= deadline:
                self.procs.append(Unstarted())
                continue
            config = RankConfig(
                rank=r,
                world_size=self.world_size,
                world_dir=self.dir,
                backend=self.backend,
                pg_timeout=self.pg_timeout,
                threads=self.threads,
            )
            reader = None
            if self.warm:
                reader, writer = ctx.Pipe(duplex=False)
                self.conns.append(writer)
            args = (config, None, reader) if self.warm else (config, job, None)
            proc = ctx.Process(target=rank_main, args=args, name=f"ddpfaults-rank{r}", daemon=False)
            with _main_hidden(hide_main):
                proc.start()
            if reader is not None:
                reader.close()
            census.LAUNCHED.append(proc.pid)
            self.procs.append(proc)
        if self.warm:
            self.send(job)

    def send(self, job: Job) -> None:
        """Give every (warm) rank its next job."""
        for conn in self.conns:
            conn.send(job)
        self.runs += 1

    def live(self) -> list[int]:
        """Indices of the ranks whose process is still running (a rank never started is not)."""
        return [i for i, p in enumerate(self.procs) if p.pid is not None and p.exitcode is None]

    def pids(self) -> list[int]:
        """Process ids of the ranks started so far."""
        return [p.pid for p in self.procs if p.pid is not None]

    def close(self) -> None:
        """SIGKILL every rank and everything it started (see :func:`census.survivors`: its process group, its
        descendants in other sessions, orphans the fork server adopted), wait until none is left, remove the dir.

        Idempotent: a second call (e.g. from a ``finally``) does nothing.
        """
        if self.closed:
            return
        self.closed = True
        pids = self.pids()
        census.POOLED.difference_update(pids)
        for conn in self.conns:
            conn.close()
        tree.kill(pid for pid, _ in census.survivors(pids))
        for proc in self.procs:
            proc.join(timeout=10)
        deadline = time.monotonic() + 5
        while (left := census.survivors(pids)) and time.monotonic() < deadline:
            tree.kill(pid for pid, _ in left)
            time.sleep(0.01)
        shutil.rmtree(self.dir, ignore_errors=True)


class Unstarted:
    """A rank whose process was never started: start-up ran out of time before its turn."""

    pid = None
    exitcode = None

    def join(self, timeout=None) -> None:
        """Nothing to wait for."""


_fork_server = {"pid": None, "probe": None}  # the fork server known to fork; the thread asking it for a first fork


def fork_server_ready(timeout: float) -> bool:
    """True once multiprocessing's fork server (started if needed) has forked a first process: it answers only
    after importing the preload modules (torch: seconds on a cold or busy machine). Waits at most ``timeout``
    seconds; a wait cut short goes on in the background, so a later world finds the server ready."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(_FORKSERVER_PRELOAD)
    forkserver.ensure_running()
    server = mp_private.fork_server_pid()
    if server == _fork_server["pid"]:
        return True
    probe = _fork_server["probe"]
    if probe is None or not probe.is_alive():

        def first_fork():
            try:
                mp_private.ProbePopen(ctx.Process(target=forkserver_probe, name="ddpfaults-fork-server-probe")).wait()
            finally:  # a probe that fails to launch leaves the ranks' own start to wait for the server, as without it
                _fork_server["pid"] = server

        probe = _fork_server["probe"] = threading.Thread(target=first_fork, name="ddpfaults-fork-server", daemon=True)
        probe.start()
    probe.join(max(timeout, 0.0))
    return _fork_server["pid"] == server


def keep(ranks: RankSet, faults: Plan, result) -> bool:
    """True if ``ranks`` may go back to the pool after ``result`` under ``faults``: a data-only plan (its word:
    :attr:`~ddpfaults.faults.Plan.data_only`), a world that :func:`settled`, and a flight record not past
    :data:`RECORD_LIMIT` (counting this job) unless every rank emptied its record as the job started."""
    if not all(_fresh_record(r) for r in result.ranks):
        ranks.recorded += max((len(r.collectives) for r in result.ranks), default=0)
    return faults.data_only and settled(result) and ranks.recorded <= RECORD_LIMIT


def _fresh_record(rank) -> bool:
    """True if the rank's flight record held nothing of earlier jobs when its job started (its start event)."""
    return any(e.get("k") == "start" and e.get("fresh_record") for e in rank.events)


def settled(result) -> bool:
    """True if the world completed, every rank finished its function, and no collective of this job is left
    unmatched, as torch's flight recorder saw them (every rank's record read; or no collective at all): every rank
    made the same collectives in the same order, and as many sends as receives were made. Where and at which step
    each rank made them may differ (a rank cut short by ``UnevenInputs`` makes its last all_reduce steps earlier).
    A process group holding unmatched work would hand it to the next job (an async all_reduce left unwaited on one
    rank hung the next fault-free job on that world). Not "every entry completed": a rank dumps its record as its
    function returns, and gloo may retire the last entry a moment later (docs/measurements.md: a settled world)."""
    ranks = result.ranks
    ops = [[c.op for c in r.collectives] for r in ranks]
    every = [op for rank_ops in ops for op in rank_ops]
    collectives = {tuple(op for op in rank_ops if op not in POINT_TO_POINT) for rank_ops in ops}
    return (
        result.outcome == "completed"
        and all(r.state == "finished" for r in ranks)
        and ({r.recorder for r in ranks} == {"flight recorder"} or not every)
        and len(collectives) <= 1
        and sum(op in ("send", "isend") for op in every) == sum(op in ("recv", "irecv") for op in every)
    )


_POOL: dict[tuple, RankSet] = {}


def world_key(spec) -> tuple:
    """The shape a warm world must have to run ``spec`` (a RunSpec): world size, backend, start method, threads."""
    return (spec.world_size, spec.backend, spec.start_method, spec.threads)


def pooled(key: tuple) -> bool:
    """True if a warm world of shape ``key`` is pooled."""
    return key in _POOL


def take(key: tuple) -> RankSet | None:
    """A warm world for ``key`` whose ranks are all alive, or None."""
    ranks = _POOL.pop(key, None)
    if ranks is None:
        return None
    census.POOLED.difference_update(ranks.pids())
    if len(ranks.live()) != ranks.world_size:
        ranks.close()
        return None
    return ranks


def give_back(ranks: RankSet) -> None:
    """Keep a healthy world warm for the next run with the same key."""
    previous = _POOL.pop(ranks.key, None)
    if previous is not None:
        previous.close()
    _POOL[ranks.key] = ranks
    census.POOLED.update(ranks.pids())


def standby(spec, hide_main: bool) -> None:
    """Pool a warm world of ``spec``'s shape (unless one is pooled) whose ranks run :func:`~ddpfaults.rank.job.warm_up`
    now: a restart's next attempt takes it, its ranks started and joined while the attempt before it runs."""
    key = world_key(spec)
    if key in _POOL:
        return
    ranks = RankSet.of(spec, warm=True)
    job_dir = tempfile.mkdtemp(prefix="warm-up-", dir=ranks.dir)
    os.mkdir(os.path.join(job_dir, "shared"))
    job = Job(
        job_dir=job_dir,
        shared_dir=os.path.join(job_dir, "shared"),
        spec=dataclasses.replace(spec, check_resume=False, cuda_on_cpu=False),  # the attempt's job maps CUDA
        runnable=Runnable(pickle.dumps((warm_up, (), {})), warm_up.__module__),
        env=dict(os.environ),
    )
    ranks.start(job, hide_main, deadline=time.monotonic() + spec.startup_limit)
    if len(ranks.live()) != ranks.world_size:
        ranks.close()
        return
    give_back(ranks)


def close_all() -> None:
    """Kill every warm world (at exit, or at the end of a pytest session)."""
    while _POOL:
        _, ranks = _POOL.popitem()
        ranks.close()


def warm_pids() -> list[int]:
    """Pids of the ranks kept warm right now."""
    return sorted(census.POOLED)


def _at_exit() -> None:
    """The launcher's exit: kill every warm world, then stop and reap the fork server (which reaps the ranks it
    forked first) and the resource tracker, so that nothing of ours is left, not even a zombie."""
    close_all()
    mp_private.stop_helpers(grace=STOP_GRACE, nudge=forkserver_signal)


#: seconds the fork server and the resource tracker get to exit once asked, before they are signalled
STOP_GRACE = 10.0


atexit.register(_at_exit)


@contextlib.contextmanager
def _main_hidden(hide: bool):
    """Start ranks without multiprocessing re-running the launcher's ``__main__`` script in them.

    spawn/forkserver children re-execute the main script (as ``__mp_main__``) so that objects
    defined there unpickle; ranks only need that when ``fn`` itself lives in ``__main__``.
    Otherwise it costs time and breaks for ``python -`` or unguarded scripts.
    """
    if not hide:
        yield
        return
    saved = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = saved
