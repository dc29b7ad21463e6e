"""One scenario case on a world that torchrun starts: ``torchrun ... -m ddpfaults.launch FILE.py::name[variant]``.

Every rank process torchrun starts runs this module. It reads RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR and MASTER_PORT, initialises the backend (gloo; or NCCL for CUDA tensors, one GPU per
local rank) and runs the case's function with the local engine's :class:`~ddpfaults.context.RankContext`,
tracing and faults. Instead of files read by a parent it publishes everything through a store
(keys in :mod:`ddpfaults.storewatch`), and the rank holding the judge's seat (rank 0) judges the world.

**The store** is torchrun's own: its agent hosts a TCPStore at MASTER_ADDR:MASTER_PORT for the
workers (``TORCHELASTIC_USE_AGENT_STORE=True``, the default with both c10d and static rendezvous);
ddpfaults opens its own client connections and keeps its keys under ``ddpfaults/<run id>/<restart>``.
That store outlives every worker, so a dead rank's last report and the verdict survive it. Without
an agent store (``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``, or another launcher) rank 0 hosts a
TCPStore on MASTER_PORT+1; then the store, and every verdict, die with rank 0.

**Three threads per rank.** The *watchdog* publishes a heartbeat, the CPU time and new events every
tick, dumps its main thread's stack (faulthandler) when the judge asks, takes the judge's seat if its
holder stops heartbeating, and ends the process once the verdict is published. A *signal* thread holds
SIGTERM/SIGINT/SIGHUP: torchrun's agent stops every worker as soon as one exits abnormally, so the
signal is recorded (a ``terminated`` event) and the rank stays up until the verdict, at most
:data:`HOLD_LIMIT` seconds (the agent sends SIGKILL after 30). The *main* thread runs the function.

**Ordering.** A rank's result is set in the store before its ``finished``/``failed`` event, and no rank
exits before the verdict: a failed rank in ``peer_failure="exit"`` mode shuts down its connections to
its peers (they get "Connection closed by peer", as if it had exited) and stays up, idle. So torchrun
sees no failed worker while the judge gathers, and rank 0 keeps judging even when its own function
failed. Only a process that really dies (signal, ``os._exit``, C++ abort) leaves early: it is judged
*died* once its heartbeat stops; if it held the seat, the first rank to notice takes over. Each rank's
stderr is also copied (by a ``tee`` child, which outlives it) into a node-local file, so a judge on the
same node quotes a died rank's last words (gloo's abort message, faulthandler's stack) as the local engine does.

Exit codes: 0 the verdict matched the case's ``Expect``; 1 it did not (or the judge failed); 2 bad
arguments or environment (e.g. ``--backend nccl`` without CUDA); 128+N no verdict within
:data:`HOLD_LIMIT` of the agent's signal N. torchrun exits 0 only if every worker did.
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import pickle
import re
import shlex
import shutil
import signal
import socket
import stat
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass

T_START = time.time()  # this rank's start; rank 0's is the world's start (``t0``)

# light imports only: torch is imported after the signal mask is set (main)
from .errors import DDPFaultsError
from .scenario import RunOptions, load_module, scenarios_in

EXIT_MATCHED, EXIT_MISMATCHED, EXIT_CONFIG = 0, 1, 2
HOLD_LIMIT = 10.0  # seconds a rank stays up after torchrun's SIGTERM, waiting for the verdict
STORE_LOST = 10.0  # seconds of failing store calls after which a rank gives up and exits
HELD_SIGNALS = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}
_SPEC = re.compile(r"^(?P<path>.+?\.py)(?:::(?P<name>[\w.]+)(?:\[(?P<variant>[\w.-]+)\])?)?$")


def parse_args(argv=None) -> argparse.Namespace:
    """The command line of a rank (the same on every rank)."""
    parser = argparse.ArgumentParser(prog="torchrun --nproc-per-node=N -m ddpfaults.launch",
                                     description="Run one ddpfaults scenario case on a world started by torchrun.")
    parser.add_argument("spec", help="path/scenario_x.py::name[variant] (the name may be left out if the file "
                                     "has one scenario, the variant if it has none)")
    parser.add_argument("--backend", choices=("gloo", "nccl"), default="gloo",
                        help="gloo (CPU), or nccl: CUDA tensors on NCCL, one GPU per local rank (CPU ones on gloo)")
    parser.add_argument("--report", metavar="PATH.json", help="the judge writes the world as a ddpfaults.report/1 "
                                                              "document here (on its own node)")
    parser.add_argument("--stall", type=float, help="stall window in seconds (default: the scenario's, else 2)")
    parser.add_argument("--timeout", type=float, help="hard cap in seconds from rank 0's start (default: the "
                                                      "scenario's, else 60)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--shared-dir", help="where ctx.shared_dir is made (default: the node's temp dir; give a "
                                             "shared filesystem for scenarios sharing files across nodes)")
    return parser.parse_args(argv)


def load_case(spec: str):
    """The :class:`~ddpfaults.scenario.Case` named by ``FILE.py::name[variant]``."""
    match = _SPEC.match(spec)
    if not match:
        raise DDPFaultsError(f"case {spec!r}: expected path/scenario_x.py::name[variant]")
    path, name, variant = match.group("path", "name", "variant")
    if not os.path.isfile(path):
        raise DDPFaultsError(f"case {spec!r}: file {path!r} not found")
    found = scenarios_in(load_module(path))
    chosen = [s for s in found if name in (None, s.name)]
    if len(chosen) != 1:
        raise DDPFaultsError(f"case {spec!r}: name one scenario of {path}: {[s.name for s in found]}")
    cases = chosen[0].cases()
    picked = [c for c in cases if (c.variant.name if c.variant else None) == variant]
    if not picked and variant is None and len(cases) == 1:
        picked = cases
    if not picked:
        raise DDPFaultsError(f"case {spec!r}: pick one of {[c.id for c in cases]}")
    return picked[0]


@dataclass(frozen=True)
class TorchrunEnv:
    """What torchrun tells a worker through its environment."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str
    master_port: int
    run_id: str
    restart: int
    agent_store: bool  # torchrun's agent hosts the store at MASTER_ADDR:MASTER_PORT

    @classmethod
    def from_environ(cls, environ=os.environ) -> TorchrunEnv:
        """Read it; a missing variable means this process was not started by torchrun."""
        missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k not in environ]
        if missing:
            raise DDPFaultsError(f"{', '.join(missing)} not set: start this module with torchrun, e.g. "
                                 f"torchrun --standalone --nproc-per-node=4 -m ddpfaults.launch FILE.py::name")
        world_size = int(environ["WORLD_SIZE"])
        return cls(rank=int(environ["RANK"]), world_size=world_size, local_rank=int(environ.get("LOCAL_RANK", 0)),
                   local_world_size=int(environ.get("LOCAL_WORLD_SIZE", world_size)),
                   master_addr=environ["MASTER_ADDR"], master_port=int(environ["MASTER_PORT"]),
                   run_id=environ.get("TORCHELASTIC_RUN_ID", "none"),
                   restart=int(environ.get("TORCHELASTIC_RESTART_COUNT", 0)),
                   agent_store=environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True")


def resolve_settings(case, env: TorchrunEnv, args) -> dict:
    """The case's world settings for this torchrun world (declared values, then the command line)."""
    from .faults import check_faults

    declared = case.world_kwargs(RunOptions(world_size=env.world_size, seed=args.seed))
    if declared["world_size"] != env.world_size and env.rank == 0:
        print(f"ddpfaults: {case.id} declares world_size={declared['world_size']}; torchrun started "
              f"{env.world_size} ranks, running on those", file=sys.stderr)
    try:
        faults = check_faults(case.faults, env.world_size)
    except DDPFaultsError as exc:
        raise DDPFaultsError(f"case {case.id} on {env.world_size} ranks: {exc}") from None
    stall = args.stall if args.stall is not None else declared["stall"]
    timeout = args.timeout if args.timeout is not None else declared["timeout"]
    if not 0 < stall < timeout:
        raise DDPFaultsError(f"stall ({stall:g} s) must be positive and shorter than timeout ({timeout:g} s)")
    nodes = max(1, env.world_size // max(env.local_world_size, 1))
    launcher = (f"torchrun --standalone --nproc-per-node={env.local_world_size}" if nodes == 1 else
                f"torchrun --nnodes={nodes} --nproc-per-node={env.local_world_size} --rdzv-backend=c10d "
                f"--rdzv-endpoint={env.master_addr}:PORT")
    from .world import describe_function

    return dict(
        world_size=env.world_size, faults=faults, seed=args.seed, stall=stall, timeout=timeout,
        peer_failure=declared["peer_failure"], kwargs=declared["kwargs"], backend=args.backend,
        function=describe_function(case.scenario.fn),
        replay=f"{launcher} -m ddpfaults.launch {shlex.quote(args.spec)} --backend {args.backend} "
               f"--seed {args.seed} --stall {stall:g} --timeout {timeout:g}",
    )


def process_group_backend(backend: str, env: TorchrunEnv) -> str:
    """The ``init_process_group`` backend for ``--backend``; raises a clear error when NCCL cannot run here."""
    if backend == "gloo":
        return "gloo"
    import torch

    if not torch.cuda.is_available():
        raise DDPFaultsError(f"--backend nccl needs CUDA GPUs, but torch.cuda.is_available() is False on "
                             f"{socket.gethostname()} (torch {torch.__version__}); use --backend gloo on CPUs")
    if torch.cuda.device_count() <= env.local_rank:
        raise DDPFaultsError(f"--backend nccl needs one GPU per local rank: LOCAL_RANK={env.local_rank} but "
                             f"{torch.cuda.device_count()} GPU(s) visible; lower --nproc-per-node")
    return "cpu:gloo,cuda:nccl"  # CUDA tensors on NCCL; CPU tensors (scenario bookkeeping) still work


def connect_store(env: TorchrunEnv, timeout: float):
    """(this run's store, ports whose connections are the store's): torchrun's agent store, else rank 0's own."""
    from datetime import timedelta

    import torch.distributed as dist

    port = env.master_port if env.agent_store else env.master_port + 1
    base = dist.TCPStore(env.master_addr, port, world_size=None if env.agent_store else env.world_size,
                         is_master=not env.agent_store and env.rank == 0, timeout=timedelta(seconds=timeout),
                         wait_for_workers=False)
    return dist.PrefixStore(f"ddpfaults/{env.run_id}/{env.restart}", base), {env.master_port, port}


def sever_peer_sockets(keep_ports: set) -> int:
    """Shut down this process's TCP connections except the store's: what its exit would do to its peers."""
    severed = 0
    for name in os.listdir("/proc/self/fd"):
        try:
            if not stat.S_ISSOCK(os.fstat(int(name)).st_mode):
                continue
            sock = socket.socket(fileno=os.dup(int(name)))
        except OSError:
            continue
        try:
            if sock.type != socket.SOCK_STREAM or sock.family not in (socket.AF_INET, socket.AF_INET6):
                continue
            peer, local = sock.getpeername(), sock.getsockname()
            if peer[1] not in keep_ports and local[1] not in keep_ports:
                sock.shutdown(socket.SHUT_RDWR)
                severed += 1
        except OSError:
            pass  # a listening or unconnected socket
        finally:
            sock.close()  # the duplicate only
    return severed


def tee_stderr(path: str):
    """Copy this process's fd 2 into ``path`` too, through a ``tee`` child that outlives an abrupt death.

    The judge reads a died rank's file (when it runs on the same node) for the line that says why, as
    the local engine reads a rank's captured output. The child inherits the blocked held signals, so
    torchrun's SIGTERM to the process group does not stop it; it ends when every writer has exited.
    """
    import subprocess

    read_end, write_end = os.pipe()
    try:
        proc = subprocess.Popen(["tee", "-a", path], stdin=read_end, stdout=os.dup(2), close_fds=True)
    except OSError:
        os.close(read_end)
        os.close(write_end)
        return None
    os.close(read_end)
    sys.stderr.flush()
    os.dup2(write_end, 2)
    os.close(write_end)
    return proc


def main_thread_stack(dump: str, ident: int) -> str:
    """The main thread (``ident``) out of a faulthandler dump, from the innermost frame up to this module's."""
    blocks = [b.strip() for b in re.split(r"\n(?=(?:Current thread|Thread) 0x)", dump) if b.strip()]
    ids = [re.match(r"(?:Current thread|Thread) (0x[0-9a-f]+)", b) for b in blocks]
    block = next((b for b, m in zip(blocks, ids) if m and int(m.group(1), 16) == ident), blocks[-1] if blocks else "")
    lines = block.splitlines()
    end = next((i for i, line in enumerate(lines) if "ddpfaults/launch.py" in line), len(lines) - 1)
    return "\n".join(lines[: end + 1])


def dump_main_stack() -> str:
    """This process's main-thread Python stack, dumped by faulthandler (works while it waits in C++)."""
    with tempfile.TemporaryFile("w+") as f:
        faulthandler.dump_traceback(file=f, all_threads=True)
        f.seek(0)
        return main_thread_stack(f.read(), threading.main_thread().ident)


class Watchdog(threading.Thread):
    """A rank's link to the store: heartbeat, events, stack dumps, the judge's seat, the verdict, the exit."""

    def __init__(self, store, env: TorchrunEnv, events, start_judge, cleanup):
        super().__init__(name="ddpfaults-watchdog", daemon=True)
        self.store, self.env, self.events = store, env, events
        self.start_judge, self.cleanup = start_judge, cleanup
        self.judging = None  # the judge thread, while this rank holds the seat
        self.beats = self.served = 0
        self.seat, self.seat_hb, self.seat_seen = 0, None, time.monotonic()
        self.terminated_at = None

    def run(self) -> None:
        """Tick until the verdict (or a lost store, or the hold limit) ends the process."""
        from .storewatch import TICK

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
        from .storewatch import ensure_keys

        me = self.env.rank
        self.beats += 1
        self.events.flush(self.store, [f"hb/{me}", f"cpu/{me}"], [str(self.beats), str(int(time.process_time() * 1e6))])
        verdict, seat, asked, seat_hb = (int(v) for v in self.store.multi_get(
            ["verdict", "judge", f"stackreq/{me}", f"hb/{self.seat}"]))
        if verdict:
            if self.judging is not None:
                self.judging.join(timeout=30)  # it published the verdict as its last act
            self.exit(EXIT_MATCHED if verdict == 1 else EXIT_MISMATCHED)
        if asked > self.served:
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
        from .storewatch import DEAD_AFTER, DEAD_AFTER_TERM

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


def _hold_signals(watchdog: Watchdog) -> None:
    """The signal thread: every held signal goes to the watchdog instead of killing the rank."""
    while True:
        watchdog.on_signal(signal.sigwait(HELD_SIGNALS))


def judge_world(store, env: TorchrunEnv, case, settings: dict, args) -> None:
    """The judge thread: watch the world through the store, print and write its result, publish the verdict."""
    from .reportfile import write_document
    from .storewatch import Judge

    code = 3
    try:
        t0 = T_START if env.rank == 0 or not store.check(["t0"]) else float(store.multi_get(["t0"])[0])
        judge = Judge(store, world_size=env.world_size, settings=settings, t0_wall=t0,
                      holds_seat=lambda: int(store.multi_get(["judge"])[0]) == env.rank)
        result = judge.run()
        if result is None:
            return  # another rank took the seat
        mismatches = case.expect.mismatches(result)
        verdict = "OK" if not mismatches else "MISMATCH"
        lines = [result.report(), "", f"expected {case.expect.describe()}, observed {result.outcome}: {verdict}"]
        print("\n".join(lines + [f"- {m}" for m in mismatches]), flush=True)
        if args.report:
            write_document(args.report, [result], nodeids=[args.spec])
        code = 1 if not mismatches else 2
    except Exception:  # noqa: BLE001 - a judge failure still ends the world (verdict 3, every rank exits 1)
        traceback.print_exc()
    store.compare_set("verdict", "0", str(code))


def _verdict_published(store) -> bool:
    try:
        return int(store.multi_get(["verdict"])[0]) != 0
    except Exception:  # noqa: BLE001 - the store gone: the agent tore the world down, report what we can
        return False


def _init_process_group(ctx, backend: str, env: TorchrunEnv, pg_timeout: float) -> None:
    from datetime import timedelta

    import torch.distributed as dist

    seq = ctx._enter("init_process_group", [], "ddpfaults")
    dist.init_process_group(backend, init_method="env://", rank=env.rank, world_size=env.world_size,
                            timeout=timedelta(seconds=pg_timeout))
    ctx._exit(seq)


def _run_case(case, settings: dict, env: TorchrunEnv, store, events, keep_ports: set, shared_dir: str) -> None:
    """Run the case's function on this rank; publish its result (before the end event) and return."""
    import torch

    from . import context
    from .context import RankContext
    from .errors import UnpicklableReturnValue
    from .rank import Job, _error_site, _error_text, _seed_everything

    fn = case.scenario.fn
    job = Job(job_dir=shared_dir, shared_dir=shared_dir, seed=settings["seed"], peer_failure=settings["peer_failure"],
              payload=b"", fn_module=fn.__module__, fn_file=getattr(sys.modules.get(fn.__module__), "__file__", None),
              faults=settings["faults"], env={})
    pg_backend = process_group_backend(settings["backend"], env)
    if settings["backend"] == "nccl":
        torch.cuda.set_device(env.local_rank)
    _seed_everything(job.seed)
    ctx = RankContext(rank=env.rank, world_size=env.world_size, seed=job.seed, shared_dir=job.shared_dir,
                      backend=settings["backend"], peer_failure=job.peer_failure, faults=job.faults, events=events)
    if settings["backend"] == "nccl":
        ctx.device = torch.device("cuda", env.local_rank)
    context.install_tracing()
    context.activate(ctx)
    result = {"value": None, "error": None, "traceback": None, "site": None}
    try:
        _init_process_group(ctx, pg_backend, env, settings["timeout"] + 30.0)
        value = fn(ctx, **settings["kwargs"])
        try:
            result["value"] = pickle.dumps(value)
        except Exception as exc:
            raise UnpicklableReturnValue(f"rank {env.rank}: the function returned {type(value).__name__} "
                                         f"{value!r:.80}, which cannot be pickled ({_error_text(exc)})") from None
    except BaseException as exc:  # noqa: BLE001 - every failure of user code is reported, not propagated
        if _verdict_published(store):
            return  # a peer left after the verdict: this rank is about to exit, nothing more to report
        result.update(error=_error_text(exc), traceback=traceback.format_exc(), site=_error_site(exc))
        events.set(store, f"res/{env.rank}", pickle.dumps(result))
        events.emit("failed", error=result["error"], site=result["site"], step=ctx.current_step)
        sys.stderr.write(result["traceback"])
        sys.stderr.flush()
        if job.peer_failure == "exit":
            events.emit("severed", sockets=sever_peer_sockets(keep_ports))
        return
    context.activate(None)
    events.set(store, f"res/{env.rank}", pickle.dumps(result))
    events.emit("finished", step=ctx.current_step)


def main(argv=None) -> int:
    """A rank's life; returns only on a configuration error (otherwise the watchdog ends the process)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, HELD_SIGNALS)  # before any thread exists: every thread inherits it
    args = parse_args(argv)
    try:
        env = TorchrunEnv.from_environ()
        case = load_case(args.spec)
        settings = resolve_settings(case, env, args)
        process_group_backend(args.backend, env)
    except DDPFaultsError as exc:
        if os.environ.get("RANK", "0") == "0":
            print(f"ddpfaults: error: {exc}", file=sys.stderr)
        return EXIT_CONFIG

    from .storewatch import StoreEventLog, ensure_keys, rank_keys

    faulthandler.enable(file=sys.stderr, all_threads=True)
    store, keep_ports = connect_store(env, settings["timeout"] + 30.0)
    if env.rank == 0:
        store.set("t0", repr(T_START))
    store.compare_set("judge", "", "0")
    ensure_keys(store, ["verdict", "hb/0", *rank_keys(env.rank)])
    safe_id = re.sub(r"[^\w.-]", "_", f"{env.run_id}-{env.master_port}-{env.restart}")
    shared_dir = os.path.join(args.shared_dir or tempfile.gettempdir(), f"ddpfaults-torchrun-{safe_id}")
    os.makedirs(shared_dir, exist_ok=True)
    output_dir = os.path.join(tempfile.gettempdir(), f"ddpfaults-torchrun-{safe_id}.output")  # always node-local
    os.makedirs(output_dir, exist_ok=True)
    output = os.path.join(output_dir, f"rank{env.rank}.err")
    tee_stderr(output)

    def cleanup():
        """Remove the node's shared and output dirs on the way out (any rank: after the verdict none needs them)."""
        shutil.rmtree(shared_dir, ignore_errors=True)
        shutil.rmtree(output_dir, ignore_errors=True)

    def start_judge():
        """Start this rank's judge thread (it holds the seat)."""
        thread = threading.Thread(target=judge_world, args=(store.clone(), env, case, settings, args),
                                  name="ddpfaults-judge", daemon=True)
        thread.start()
        return thread

    events = StoreEventLog(env.rank, store)
    watchdog = Watchdog(store.clone(), env, events, start_judge, cleanup)
    watchdog.start()
    threading.Thread(target=_hold_signals, args=(watchdog,), name="ddpfaults-signals", daemon=True).start()
    events.emit("start", pid=os.getpid(), host=socket.gethostname(), local_rank=env.local_rank, output=output,
                main_thread=threading.main_thread().ident)
    _run_case(case, settings, env, store, events, keep_ports, shared_dir)
    threading.Event().wait()  # finished or failed: stay up (process group open) until the watchdog sees the verdict
    return EXIT_MISMATCHED  # not reached


if __name__ == "__main__":
    sys.exit(main())
