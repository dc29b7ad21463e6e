"""The entry point of a rank process. Imports nothing from the plugin or the launcher.

A rank runs one job (cold world) or, in a warm world, job after job with its process group
kept open. For each job it writes everything the launcher needs into files in the job's
private directory (:mod:`ddpfaults.jobfiles` names them), so nothing is lost when it dies abruptly.
"""

from __future__ import annotations

import faulthandler
import multiprocessing
import multiprocessing.connection
import os
import pickle
import shutil
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta

import psutil
import torch
import torch.distributed as dist

from ddpfaults import jobfiles
from ddpfaults.faults import batches
from ddpfaults.proc import tree
from ddpfaults.rank import (
    context,
    cuda_on_cpu,
    files,
    flight,
    forkserver,
    preempt,
    resume,
    seams,
    torch_private,
    tracing,
)
from ddpfaults.rank.context import EventLog, RankContext
from ddpfaults.rank.job import run_job
from ddpfaults.spec import RunSpec


@dataclass(frozen=True)
class RankConfig:
    """What a rank process needs for its whole life (picklable, no user objects)."""

    rank: int
    world_size: int
    world_dir: str  # holds the FileStore; removed by the launcher when the world ends
    backend: str
    pg_timeout: float
    threads: int
    close_fds: tuple = ()  # fork only: launcher fds the child inherited and must not hold


@dataclass(frozen=True)
class Runnable:
    """What a world's ranks run, as a rank loads it: the pickled ``(fn, args, kwargs)`` (unpickled only after tracing
    is installed), ``fn``'s module and the file it lives in (to import it by path when its name is not importable in
    the rank), whether it is a script world's runner, and the working directory while it runs. The launcher's
    :class:`~ddpfaults.engine.launcher.FunctionTarget` holds one, and each :class:`Job` carries it as it is."""

    payload: bytes
    module: str
    file: str | None = None
    script: bool = False  # a script world's: it initialises its own process group, and its process ends with it
    cwd: str | None = None  # the working directory while the function runs (None: the rank's own)


@dataclass(frozen=True)
class Job:
    """One run of a user function on a world (a warm world runs many): what it runs, and this run's folders,
    settings, faults, environment and attempt."""

    job_dir: str
    shared_dir: str
    spec: RunSpec
    runnable: Runnable
    faults: tuple = ()
    env: dict = field(default_factory=dict)
    empty_batch_types: dict = field(default_factory=dict)  # register_empty_batch's transforms in the launcher
    attempt: int = 0  # the run of a restarted world (0: the first)
    resume_watch: frozenset = frozenset()  # the resume check's: see ddpfaults.rank.resume.start


def _write_result(path: str, result: dict) -> None:
    with open(path + ".tmp", "wb") as f:
        pickle.dump(result, f)
    os.replace(path + ".tmp", path)


def _watch_launcher(world_dir: str) -> None:
    """Kill everything this rank started (its process group, and below it whatever left the group) when the
    launcher dies.

    The parent sentinel is a pipe end that becomes readable when the launcher exits (for
    forkserver ranks the OS parent is the fork server, so PR_SET_PDEATHSIG alone is not enough).
    """
    tree.prctl(tree.PR_SET_PDEATHSIG, signal.SIGKILL)  # die with the OS parent too
    parent = multiprocessing.parent_process()
    if parent is None:
        return

    def watch():
        multiprocessing.connection.wait([parent.sentinel])
        shutil.rmtree(world_dir, ignore_errors=True)  # the launcher died and cannot clean up
        tree.kill_below(os.getpid())
        os.killpg(os.getpgid(0), signal.SIGKILL)

    threading.Thread(target=watch, name="ddpfaults-launcher-watch", daemon=True).start()


def world_tmp(world_dir: str) -> str:
    """The ranks' TMPDIR: a directory inside the world's, which goes when the world does."""
    return os.path.join(world_dir, "tmp")


def _use_world_tmp(world_dir: str) -> None:
    """Point TMPDIR (and ``tempfile``, which caches it) at :func:`world_tmp`: what the job leaves in temp dirs (a
    script's scratch files, multiprocessing's ``pymp-*``) cannot outlive the world, even a rank killed mid-job.
    torch.compile's cache stays where it would have been (it defaults to a directory under TMPDIR)."""
    tempfile.tempdir = None  # gettempdir() reads the job's environment again
    if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = torch_private.inductor_cache_dir()
    os.environ["TMPDIR"] = world_tmp(world_dir)
    tempfile.tempdir = None


def _redirect_output(path: str) -> None:
    """Point fds 1 and 2 (and sys.stdout/err) at ``path``."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)


def _load_payload(runnable: Runnable):
    """Unpickle (fn, args, kwargs); fall back to importing fn's module from its file if its name is not importable."""
    try:
        return pickle.loads(runnable.payload)
    except ModuleNotFoundError as exc:
        if runnable.file is None or exc.name not in (runnable.module, runnable.module.split(".")[0]):
            raise
    import importlib.util
    import types

    parts = runnable.module.split(".")
    for i in range(1, len(parts)):  # pytest's importlib mode names a test module by its path: sub.test_file
        parent = ".".join(parts[:i])
        if parent not in sys.modules:  # an empty package, so that unpickling can import the dotted name
            sys.modules[parent] = types.ModuleType(parent)
            sys.modules[parent].__path__ = []
    spec = importlib.util.spec_from_file_location(runnable.module, runnable.file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[runnable.module] = module
    spec.loader.exec_module(module)
    return pickle.loads(runnable.payload)


def _all_connected(store: dist.Store, world_size: int) -> None:
    """Return once every rank's ``init_process_group`` has returned. Gloo connects the ranks pair by pair: a rank
    done with its side may run the function, fail and exit while a peer still finishes its own, which then fails
    "Connection closed by peer" instead of getting as far, so who failed first would be the scheduler's choice. A
    function world's group is ddpfaults' own making; it ends joining as torch's store-based barrier after the group
    (``TORCH_DIST_INIT_BARRIER=1``) would end it. A script's ``init_process_group`` is left as it is."""
    key = "ddpfaults/connected"
    with tracing.untraced():
        if store.add(key, 1) == world_size:
            store.set(f"{key}/all", "1")
        store.wait([f"{key}/all"])


def _linger() -> None:
    """Keep the process (and its sockets) alive until the launcher kills it."""
    while True:
        time.sleep(3600)


def leftover_state(config: RankConfig, baseline: dict) -> list[str]:
    """Ways this rank's process differs from a fresh one after a job (any → never reuse it)."""
    found = []
    if not dist.is_initialized():
        found.append("the default process group was destroyed")
    elif len(torch_private.groups().pg_map) != 1:
        found.append(f"{len(torch_private.groups().pg_map) - 1} extra process group(s) left open")
    if torch.get_num_threads() != config.threads:
        found.append(f"torch threads changed to {torch.get_num_threads()}")
    if not torch.is_grad_enabled():
        found.append("grad mode left disabled")
    if torch.get_default_dtype() != torch.float32:
        found.append(f"default dtype left at {torch.get_default_dtype()}")
    if torch.are_deterministic_algorithms_enabled() != baseline["deterministic"]:
        found.append("deterministic-algorithms flag changed")
    if cuda_on_cpu.installed():
        found.append("CUDA is mapped to the CPU (cuda_on_cpu)")
    if not tracing.tracing_intact():
        found.append("a torch.distributed collective was replaced")
    threads = [t.name for t in threading.enumerate() if t is not threading.current_thread() and not t.daemon]
    if threads:
        found.append(f"threads still running: {threads}")
    children = multiprocessing.active_children() or _child_pids()
    if children:
        found.append(f"child processes still running: {children}")
    return found


def _child_pids() -> list[int]:
    return [child.pid for child in psutil.Process().children()]


_stack_file = None  # the open file stacks are dumped into on request (per job)


def _run_job(config: RankConfig, job: Job, baseline: dict) -> list[str]:
    """Run one job; return the leftover state after it finished. A failed job never returns."""
    r = config.rank
    _redirect_output(jobfiles.path(job.job_dir, r, "out"))
    os.environ.clear()
    os.environ.update(job.env)
    _use_world_tmp(config.world_dir)
    flight.enable()
    global _stack_file
    previous, _stack_file = _stack_file, open(jobfiles.path(job.job_dir, r, "stack"), "w")
    if previous is not None:
        previous.close()
    faulthandler.enable(file=sys.stderr, all_threads=True)
    events = EventLog(jobfiles.path(job.job_dir, r, "events"))
    # a warm rank's record still holds its earlier jobs' collectives (the first job's group is made below)
    fresh_record = flight.forget() if dist.is_initialized() else True
    started = events.emit(
        "start",
        pid=os.getpid(),
        main_thread=threading.main_thread().ident,
        fresh_record=fresh_record,
        pg_seq=context.default_group_seq(),  # a warm rank's group made collectives in earlier jobs
    )["wall"]
    flight_path = jobfiles.path(job.job_dir, r, "fr")
    recorder = flight.DumpOnRequest(flight_path, stacks=_stack_file, since_wall=started)  # the judge's cut too
    recorder.start()

    def publish(result):
        recorder.stop()
        flight.write(flight_path, since_wall=started)
        _write_result(result_path, result)

    torch.set_num_threads(config.threads)
    ctx = RankContext(
        rank=r, spec=job.spec, shared_dir=job.shared_dir, faults=job.faults, events=events, attempt=job.attempt
    )
    result_path = jobfiles.path(job.job_dir, r, "result")
    files.begin(ctx, ignore=(job.job_dir, config.world_dir))  # the job's files, not ddpfaults' own

    def init_process_group():
        if not dist.is_initialized():  # a warm rank keeps its group from the first job
            store = dist.FileStore(os.path.join(config.world_dir, "store"), config.world_size)
            dist.init_process_group(
                config.backend,
                store=store,
                rank=r,
                world_size=config.world_size,
                timeout=timedelta(seconds=config.pg_timeout),
            )
            _all_connected(store, config.world_size)

    leftovers = []

    def left_behind():
        leftovers.extend(leftover_state(config, baseline))
        return leftovers

    batches.adopt(job.empty_batch_types)
    home = _cwd()

    runs = job.runnable

    def load():
        payload = _load_payload(runs)  # by the rank's own sys.path, before the move
        if runs.cwd is not None:
            os.chdir(runs.cwd)
        return payload

    if job.spec.check_resume:
        resume.start(ctx, jobfiles.path(job.job_dir, r, "resume"), job.resume_watch)
    result = run_job(
        ctx,
        load=load,
        init_process_group=None if runs.script else init_process_group,
        publish=publish,
        leftovers=left_behind,
        process_ends=runs.script,
    )
    if result["error"] is not None:
        if job.spec.peer_failure == "exit":
            os._exit(1)
        _linger()
    if runs.script:
        _exit_as_worker()
    if runs.cwd is not None and home is not None:
        os.chdir(home)  # a warm rank's next job starts where the rank did
    return leftovers


def _cwd() -> str | None:
    """The working directory (None: it was removed under the rank)."""
    try:
        return os.getcwd()
    except FileNotFoundError:
        return None


def _exit_as_worker() -> None:
    """End the process as a torchrun worker's interpreter would after its script: exit handlers, then exit 0
    (its sockets close: peers still waiting on it get "Connection closed by peer", as under torchrun)."""
    import atexit

    try:
        atexit._run_exitfuncs()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def main(config: RankConfig, job: Job | None, jobs=None) -> None:
    """A rank process: set up once, run ``job`` — or, warm, every job received on ``jobs`` — then linger.

    A warm rank whose job left state behind stops taking jobs (the launcher will not reuse it).
    """
    os.setsid()  # own process group: the launcher kills the rank and its children with one killpg
    tree.become_subreaper()  # and what leaves the group (a new session, a daemon) stays below the rank
    forkserver.leave()
    # the user's own multiprocessing (DataLoader workers) gets the platform's default start method, as under
    # torchrun, not the fork server this rank was started by (a forkserver DataLoader waits seconds per epoch
    # and leaves pymp-* temp dirs behind a rank that ends with os._exit)
    multiprocessing.set_start_method(None, force=True)
    for fd in config.close_fds:
        try:
            os.close(fd)
        except OSError:
            pass
    _watch_launcher(config.world_dir)
    tracing.install_tracing()
    resume.install()
    seams.install()
    seams.keep_destroyed_groups()
    preempt.track_saves()
    baseline = {"deterministic": torch.are_deterministic_algorithms_enabled()}
    while True:
        if job is None:
            try:
                job = jobs.recv()
            except EOFError:
                os._exit(0)
        leftovers = _run_job(config, job, baseline)
        job = None
        if jobs is None or leftovers:
            _linger()
