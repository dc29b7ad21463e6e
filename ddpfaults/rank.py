"""The code that runs inside a rank process. Imports nothing from the plugin or the launcher.

A rank writes everything the launcher needs into files in the world's private
directory, so nothing is lost when it dies abruptly:

- ``rank{r}.events``: one JSON object per line, written unbuffered (progress,
  collectives entered and left, faults fired, the end);
- ``rank{r}.out``: the rank's stdout and stderr (fd level, so C++ messages too);
- ``rank{r}.stack``: every thread's Python stack, dumped by faulthandler on SIGUSR1;
- ``rank{r}.result``: the pickled outcome, written atomically before the final event.
"""

from __future__ import annotations

import faulthandler
import functools
import json
import multiprocessing
import multiprocessing.connection
import os
import pickle
import shutil
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from .errors import UnpicklableReturnValue
from .faults import Fault

#: collectives traced in every rank (wrapped on both torch.distributed and distributed_c10d)
TRACED_COLLECTIVES = (
    "all_reduce", "all_reduce_coalesced", "broadcast", "reduce", "all_gather", "all_gather_into_tensor",
    "all_gather_object", "gather", "gather_object", "scatter", "scatter_object_list", "reduce_scatter",
    "reduce_scatter_tensor", "all_to_all", "all_to_all_single", "broadcast_object_list", "barrier",
    "monitored_barrier", "send", "recv",
)

#: blocking torch.distributed.Store methods traced as waits on peers
TRACED_STORE_WAITS = ("wait", "get")

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__))
#: frames in these files are machinery, never the call site a report should name
_MACHINERY = (_TORCH_DIR, os.path.join(_PACKAGE_DIR, "rank.py"), os.path.join(_PACKAGE_DIR, "faults.py"))


def _is_machinery(path: str) -> bool:
    return path.startswith(_MACHINERY) or path.startswith("<")


@dataclass(frozen=True)
class RankConfig:
    """Everything a rank needs to start, sent from the launcher (picklable, no user objects)."""

    rank: int
    world_size: int
    world_dir: str
    shared_dir: str
    seed: int
    backend: str
    pg_timeout: float
    peer_failure: str
    threads: int
    payload: bytes  # pickle of (fn, args, kwargs): unpickled only after tracing is installed
    fn_module: str
    fn_file: str | None
    faults: tuple = ()
    env: dict = field(default_factory=dict)
    close_fds: tuple = ()  # fork only: launcher fds the child inherited and must not hold


class EventLog:
    """Append-only JSON-lines event file; each event is one ``os.write`` so a kill loses nothing written."""

    def __init__(self, path: str):
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)

    def emit(self, kind: str, **fields) -> None:
        """Write one event stamped with the system-wide monotonic clock."""
        fields["k"] = kind
        fields["t"] = time.monotonic()
        os.write(self._fd, (json.dumps(fields, default=str) + "\n").encode())


def _call_site() -> str:
    """``file:line in func`` of the innermost frame outside torch and ddpfaults."""
    frame = sys._getframe(2)
    while frame is not None:
        path = frame.f_code.co_filename
        if not _is_machinery(path):
            return f"{os.path.basename(path)}:{frame.f_lineno} in {frame.f_code.co_name}"
        frame = frame.f_back
    return "?"


def _shapes(args, kwargs) -> list:
    found = []
    for value in list(args) + list(kwargs.values()):
        if isinstance(value, torch.Tensor):
            found.append(list(value.shape))
        elif isinstance(value, (list, tuple)) and value and isinstance(value[0], torch.Tensor):
            found.append([list(t.shape) for t in value])
    return found


class RankContext:
    """What a rank function receives as its first argument.

    ``rank``, ``world_size``, ``seed``, ``shared_dir`` (a directory all ranks of this
    world share, removed afterwards), ``device`` (always CPU here), ``step(i)`` (the
    progress heartbeat and the clock faults use), ``fault(kind)`` and ``ddp(model)``.
    """

    def __init__(self, config: RankConfig, events: EventLog):
        self.rank = config.rank
        self.world_size = config.world_size
        self.seed = config.seed
        self.shared_dir = config.shared_dir
        self.backend = config.backend
        self.peer_failure = config.peer_failure
        self.device = torch.device("cpu")
        self.faults = tuple(config.faults)
        self.current_step: int | None = None
        self._events = events
        self._fired_once: set = set()
        self._seq = 0
        self._local = threading.local()

    # -- progress -----------------------------------------------------------------------
    def step(self, i: int) -> None:
        """Announce that this rank starts step ``i``; applies the step faults for this rank."""
        self.current_step = int(i)
        self._events.emit("step", step=self.current_step)
        for fault in self._active():
            if type(fault).on_step is not Fault.on_step:
                self._fired(fault, "on_step")
                fault.on_step(self)

    def log(self, message: str) -> None:
        """Record a free-form message in this rank's timeline (counts as progress)."""
        self._events.emit("log", msg=str(message), step=self.current_step)

    # -- faults -------------------------------------------------------------------------
    def _active(self):
        return [f for f in self.faults if f.applies(self.rank, self.current_step)]

    def fault(self, kind: type):
        """The fault of type ``kind`` that applies to this rank at the current step, or None.

        Asking marks the fault as fired (the scenario is about to act on it).
        """
        for fault in self._active():
            if isinstance(fault, kind):
                self._fired(fault, "queried")
                return fault
        return None

    def _once(self, fault) -> bool:
        key = (self.faults.index(fault), self.current_step)
        if key in self._fired_once:
            return False
        self._fired_once.add(key)
        return True

    def _fired(self, fault, how: str) -> None:
        self._events.emit("fault", index=self.faults.index(fault), fault=repr(fault), how=how, step=self.current_step)

    # -- collectives ----------------------------------------------------------------------
    def _enter(self, op: str, shapes: list, site: str, note: str = "") -> int:
        self._seq += 1
        self._events.emit("enter", seq=self._seq, op=op, shapes=shapes, site=site, step=self.current_step, note=note)
        return self._seq

    def _exit(self, seq: int) -> None:
        self._events.emit("exit", seq=seq)

    def _trace(self, op: str, original):
        @functools.wraps(original)
        def traced(*args, **kwargs):
            if getattr(self._local, "inside", False):  # nested call of a traced collective
                return original(*args, **kwargs)
            for fault in self._active():
                if fault.skips_collective(self, op):
                    self._fired(fault, f"skipped {op}")
                    return None
            seq = self._enter(op, _shapes(args, kwargs), _call_site())
            self._local.inside = True
            try:
                return original(*args, **kwargs)
            finally:
                self._local.inside = False
                self._exit(seq)

        traced.__ddpfaults_original__ = original
        return traced

    def install_tracing(self) -> None:
        """Wrap the torch.distributed collectives so each call is recorded (op, shapes, call site)."""
        for name in TRACED_COLLECTIVES:
            original = getattr(c10d, name, None)
            if original is None:
                continue
            traced = self._trace(name, original)
            setattr(c10d, name, traced)
            if getattr(dist, name, None) is original:
                setattr(dist, name, traced)
        for name in TRACED_STORE_WAITS:
            original = getattr(dist.Store, name)
            if not hasattr(original, "__ddpfaults_original__"):  # fork start: already wrapped in the parent
                setattr(dist.Store, name, self._trace_store(name, original))

    def _trace_store(self, name: str, original):
        """Record blocking store reads as waits (not collectives): a rank stuck there waits on a peer."""

        @functools.wraps(original)
        def traced(store, *args, **kwargs):
            if getattr(self._local, "inside", False):
                return original(store, *args, **kwargs)
            keys = args[0] if args else kwargs.get("keys", kwargs.get("key"))
            seq = self._enter(f"store.{name}", [], _call_site(), note=f"keys {keys!r}"[:200])
            self._local.inside = True
            try:
                return original(store, *args, **kwargs)
            finally:
                self._local.inside = False
                self._exit(seq)

        traced.__ddpfaults_original__ = original
        return traced

    def ddp(self, model: torch.nn.Module, **kwargs) -> torch.nn.parallel.DistributedDataParallel:
        """Wrap ``model`` in DDP with a tracing communication hook (records each gradient bucket's all_reduce)."""
        ddp_model = torch.nn.parallel.DistributedDataParallel(model, **kwargs)
        ddp_model.register_comm_hook(None, self._comm_hook)
        return ddp_model

    def _comm_hook(self, process_group, bucket):
        group = process_group if process_group is not None else dist.group.WORLD
        buffer = bucket.buffer()
        buffer.div_(group.size())
        seq = self._enter("all_reduce", [list(buffer.shape)], _call_site(), note=f"DDP gradient bucket {bucket.index()}")
        original = getattr(c10d.all_reduce, "__ddpfaults_original__", c10d.all_reduce)
        future = original(buffer, group=group, async_op=True).get_future()

        def done(fut):
            self._exit(seq)
            return fut.value()[0]

        return future.then(done)


def _error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".rstrip(": ") if str(exc) else type(exc).__name__


def _error_site(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    for frame in reversed(frames):
        if not _is_machinery(frame.filename):
            return f"{os.path.basename(frame.filename)}:{frame.lineno} in {frame.name}"
    return f"{os.path.basename(frames[-1].filename)}:{frames[-1].lineno} in {frames[-1].name}" if frames else "?"


def _write_result(config: RankConfig, result: dict) -> None:
    path = os.path.join(config.world_dir, f"rank{config.rank}.result")
    with open(path + ".tmp", "wb") as f:
        pickle.dump(result, f)
    os.replace(path + ".tmp", path)


def _watch_launcher(world_dir: str) -> None:
    """Kill this rank's whole process group (with its DataLoader workers) when the launcher dies.

    The parent sentinel is a pipe end that becomes readable when the launcher exits (for
    forkserver ranks the OS parent is the fork server, so PR_SET_PDEATHSIG alone is not enough).
    """
    try:
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: die with the OS parent too
    except (OSError, AttributeError):
        pass
    parent = multiprocessing.parent_process()
    if parent is None:
        return

    def watch():
        multiprocessing.connection.wait([parent.sentinel])
        shutil.rmtree(world_dir, ignore_errors=True)  # the launcher died and cannot clean up
        os.killpg(os.getpgid(0), signal.SIGKILL)

    threading.Thread(target=watch, name="ddpfaults-launcher-watch", daemon=True).start()


def _redirect_output(config: RankConfig) -> None:
    fd = os.open(os.path.join(config.world_dir, f"rank{config.rank}.out"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)


def _load_payload(config: RankConfig):
    """Unpickle (fn, args, kwargs); falls back to importing fn's module from its file if its name is not importable."""
    try:
        return pickle.loads(config.payload)
    except ModuleNotFoundError as exc:
        if config.fn_file is None or exc.name != config.fn_module.split(".")[0] and exc.name != config.fn_module:
            raise
    import importlib.util

    spec = importlib.util.spec_from_file_location(config.fn_module, config.fn_file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[config.fn_module] = module
    spec.loader.exec_module(module)
    return pickle.loads(config.payload)


def _seed_everything(seed: int) -> None:
    """Seed Python's, torch's and (if loaded) numpy's global RNGs alike on every rank."""
    import random

    random.seed(seed)
    torch.manual_seed(seed)
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed(seed % 2**32)


def _linger() -> None:
    """Keep the process (and its sockets) alive until the launcher kills it."""
    while True:
        time.sleep(3600)


def main(config: RankConfig) -> None:
    """Entry point of a rank process: set up, run the user's function, report, then linger or exit."""
    os.setsid()  # own process group: the launcher kills the rank and its children with one killpg
    for fd in config.close_fds:
        try:
            os.close(fd)
        except OSError:
            pass
    _watch_launcher(config.world_dir)
    _redirect_output(config)
    os.environ.clear()
    os.environ.update(config.env)
    with open(os.path.join(config.world_dir, f"rank{config.rank}.stack"), "w") as stack_file:
        faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True)
        faulthandler.enable(file=sys.stderr, all_threads=True)
        _run(config)


def _run(config: RankConfig) -> None:
    events = EventLog(os.path.join(config.world_dir, f"rank{config.rank}.events"))
    events.emit("start", pid=os.getpid())
    torch.set_num_threads(config.threads)
    _seed_everything(config.seed)
    ctx = RankContext(config, events)
    ctx.install_tracing()
    result = {"value": None, "error": None, "traceback": None, "site": None}
    try:
        fn, args, kwargs = _load_payload(config)
        seq = ctx._enter("init_process_group", [], "ddpfaults")
        store = dist.FileStore(os.path.join(config.world_dir, "store"), config.world_size)
        dist.init_process_group(
            config.backend, store=store, rank=config.rank, world_size=config.world_size,
            timeout=timedelta(seconds=config.pg_timeout),
        )
        ctx._exit(seq)
        value = fn(ctx, *args, **kwargs)
        try:
            result["value"] = pickle.dumps(value)
        except Exception as exc:
            raise UnpicklableReturnValue(
                f"rank {config.rank}: the function returned {type(value).__name__} {value!r:.80}, "
                f"which cannot be pickled back to the launcher ({_error_text(exc)})"
            ) from None
    except BaseException as exc:  # noqa: BLE001 - every failure of user code is reported, not propagated
        result.update(error=_error_text(exc), traceback=traceback.format_exc(), site=_error_site(exc))
        _write_result(config, result)
        events.emit("failed", error=result["error"], site=result["site"], step=ctx.current_step)
        sys.stderr.write(result["traceback"])
        sys.stderr.flush()
        if config.peer_failure == "exit":
            os._exit(1)
        _linger()
    _write_result(config, result)
    events.emit("finished", step=ctx.current_step)
    _linger()
