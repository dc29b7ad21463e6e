"""One scenario case on a world that torchrun starts: ``torchrun ... -m ddpfaults.launch FILE.py::name[variant]``.

Every rank process torchrun starts runs this module. It reads RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR and MASTER_PORT, initialises the backend (gloo; or NCCL for CUDA tensors, one GPU per
local rank) and runs the case's function with the local engine's :class:`~ddpfaults.rank.context.RankContext`,
tracing and faults. Instead of files read by a parent it publishes everything through a store
(keys in :mod:`ddpfaults.torchrun.store`), and the rank holding the judge's seat (rank 0) judges the world.

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

**Restarts** (``torchrun --max-restarts N``): an attempt that crashed or hung ends in a restart, and the last
attempt's verdict carries every attempt's (:mod:`ddpfaults.torchrun.restarts`); ``ctx.shared_dir`` is kept across
attempts; the process group's store is this attempt's (a prefix of the store above), never a dead attempt's.

Exit codes: 0 the verdict matched the case's ``Expect``; 1 it did not (or the judge failed); 2 bad
arguments or environment (e.g. ``--backend nccl`` without CUDA); 3 torchrun restarts the world; 128+N no
verdict within :data:`HOLD_LIMIT` of the agent's signal N. torchrun exits 0 only if every worker did.
"""

from __future__ import annotations

import argparse
import dataclasses
import faulthandler
import os
import pickle
import re
import shlex
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta

# light imports only: torch is imported after the signal mask is set (main)
from ddpfaults.errors import DDPFaultsError
from ddpfaults.expect import Expectation
from ddpfaults.faults import check_faults
from ddpfaults.proc import platform
from ddpfaults.replay import replay_line, settings_of
from ddpfaults.report.document import write_document
from ddpfaults.scenario import CaseRun, load_module, scenarios_in
from ddpfaults.spec import SCENARIO, TORCHRUN, RunSpec, parse_bool, settable
from ddpfaults.torchrun import restarts
from ddpfaults.torchrun.process import sever_peer_sockets, tee_stderr
from ddpfaults.torchrun.store import (
    StoreEventLog,
    ensure_keys,
    judge_store_world,
    rank_keys,
)
from ddpfaults.torchrun.watchdog import EXIT_CONFIG, EXIT_MATCHED, EXIT_MISMATCHED, HELD_SIGNALS, Watchdog, hold_signals

T_START = time.time()  # this rank's start; rank 0's is the world's start (``t0``)

_SPEC = re.compile(r"^(?P<path>.+?\.py)(?:::(?P<name>[\w.]+)(?:\[(?P<variant>[\w.-]+)\])?)?$")


def parse_args(argv=None) -> argparse.Namespace:
    """The command line of a rank (the same on every rank)."""
    parser = argparse.ArgumentParser(
        prog="torchrun --nproc-per-node=N -m ddpfaults.launch",
        description="Run one ddpfaults scenario case on a world started by torchrun.",
    )
    parser.add_argument(
        "spec",
        help="path/scenario_x.py::name[variant] (the name may be left out if the file "
        "has one scenario, the variant if it has none)",
    )
    parser.add_argument(
        "--report",
        metavar="PATH.json",
        help="the judge writes the world as a ddpfaults.report/4 document here (on its own node)",
    )
    for param in settable(TORCHRUN):
        default = f"the scenario's, else {param.text(param.default)}" if SCENARIO in param.places else param.default
        parser.add_argument(
            param.option,
            dest=param.name,
            type=param.parse if param.parse in (int, float, parse_bool) else None,
            **({"nargs": "?", "const": True} if param.parse is parse_bool else {}),  # --cuda-on-cpu alone: true
            choices=param.choices or None,
            metavar=None if param.choices else param.metavar,
            help=f"{param.help} (default: {default})",
        )
    parser.add_argument(
        "--shared-dir",
        help="where ctx.shared_dir is made (default: the node's temp dir; give a "
        "shared filesystem for scenarios sharing files across nodes)",
    )
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
    restart: int  # TORCHELASTIC_RESTART_COUNT: the attempt
    max_restarts: int  # torchrun's --max-restarts
    agent_store: bool  # torchrun's agent hosts the store at MASTER_ADDR:MASTER_PORT

    @classmethod
    def from_environ(cls, environ=os.environ) -> TorchrunEnv:
        """Read it; a missing variable means this process was not started by torchrun."""
        missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k not in environ]
        if missing:
            raise DDPFaultsError(
                f"{', '.join(missing)} not set: start this module with torchrun, e.g. "
                f"torchrun --standalone --nproc-per-node=4 -m ddpfaults.launch FILE.py::name"
            )
        world_size = int(environ["WORLD_SIZE"])
        return cls(
            rank=int(environ["RANK"]),
            world_size=world_size,
            local_rank=int(environ.get("LOCAL_RANK", 0)),
            local_world_size=int(environ.get("LOCAL_WORLD_SIZE", world_size)),
            master_addr=environ["MASTER_ADDR"],
            master_port=int(environ["MASTER_PORT"]),
            run_id=environ.get("TORCHELASTIC_RUN_ID", "none"),
            restart=int(environ.get("TORCHELASTIC_RESTART_COUNT", 0)),
            max_restarts=int(environ.get("TORCHELASTIC_MAX_RESTARTS", 0)),
            agent_store=environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True",
        )


def resolve_plan(case, env: TorchrunEnv, args) -> CaseRun:
    """The case resolved for this torchrun world (declared values, then the command line), with its replay line."""
    declared = case.resolve(RunSpec(world_size=env.world_size))
    if declared.spec.world_size != env.world_size and env.rank == 0:
        print(
            f"ddpfaults: {case.id} declares world_size={declared.spec.world_size}; torchrun started "
            f"{env.world_size} ranks, running on those",
            file=sys.stderr,
        )
    try:
        faults = check_faults(case.faults, env.world_size)
        spec = declared.spec.replace(**{param.name: getattr(args, param.name) for param in settable(TORCHRUN)})
        spec = dataclasses.replace(spec, world_size=env.world_size)
        local = f"python -m ddpfaults matrix {shlex.quote(args.spec.split('::')[0])}"
        spec = restarts.check_restarts(case, spec, faults, env, local)
    except DDPFaultsError as exc:
        raise type(exc)(f"case {case.id} on {env.world_size} ranks: {exc}") from None
    nodes = max(1, env.world_size // max(env.local_world_size, 1))
    launcher = (
        f"torchrun --standalone --nproc-per-node={env.local_world_size}"
        if nodes == 1
        else f"torchrun --nnodes={nodes} --nproc-per-node={env.local_world_size} --rdzv-backend=c10d "
        f"--rdzv-endpoint={env.master_addr}:PORT"
    ) + (f" --max-restarts {env.max_restarts}" if env.max_restarts else "")
    replay = replay_line([launcher, "-m ddpfaults.launch", shlex.quote(args.spec)], settings_of(spec, TORCHRUN))
    return dataclasses.replace(declared, spec=spec, faults=faults, replay=replay)


def process_group_backend(backend: str, env: TorchrunEnv) -> str:
    """The ``init_process_group`` backend for ``--backend``; raises a clear error when NCCL cannot run here."""
    if backend == "gloo":
        return "gloo"
    import torch

    if not torch.cuda.is_available():
        raise DDPFaultsError(
            f"--backend nccl needs CUDA GPUs, but torch.cuda.is_available() is False on "
            f"{socket.gethostname()} (torch {torch.__version__}); use --backend gloo on CPUs"
        )
    if torch.cuda.device_count() <= env.local_rank:
        raise DDPFaultsError(
            f"--backend nccl needs one GPU per local rank: LOCAL_RANK={env.local_rank} but "
            f"{torch.cuda.device_count()} GPU(s) visible; lower --nproc-per-node"
        )
    return "cpu:gloo,cuda:nccl"  # CUDA tensors on NCCL; CPU tensors (scenario bookkeeping) still work


def connect_store(env: TorchrunEnv, timeout: float):
    """(this attempt's store, the run's store (every attempt's), ports whose connections are the store's):
    torchrun's agent store, else rank 0's own."""
    import torch.distributed as dist

    port = env.master_port if env.agent_store else env.master_port + 1
    base = dist.TCPStore(
        env.master_addr,
        port,
        world_size=None if env.agent_store else env.world_size,
        is_master=not env.agent_store and env.rank == 0,
        timeout=timedelta(seconds=timeout),
        wait_for_workers=False,
    )
    run_store = dist.PrefixStore(f"ddpfaults/{env.run_id}", base)
    return dist.PrefixStore(str(env.restart), run_store.clone()), run_store, {env.master_port, port}


def judge_world(store, run_store, env: TorchrunEnv, case, plan: CaseRun, args) -> None:
    """The judge thread: watch the world through the store, print and write its result, publish the verdict
    (a restart's: :mod:`ddpfaults.torchrun.restarts`)."""
    code = 3
    try:
        t0 = T_START if env.rank == 0 or not store.check(["t0"]) else float(store.multi_get(["t0"])[0])
        result = judge_store_world(
            store,
            spec=plan.spec,
            t0_wall=t0,
            holds_seat=lambda: int(store.multi_get(["judge"])[0]) == env.rank,
            plan=plan.faults,
            function=plan.function,
            replay=plan.replay,
        )
        if result is None:
            return  # another rank took the seat
        attempt = result
        result = restarts.conclude(run_store, attempt, env, plan.faults)
        if result is None:
            print(
                f"{attempt.report()}\n\nattempt {env.restart}: {attempt.outcome}; torchrun restarts the world",
                flush=True,
            )
            store.compare_set("verdict", "0", str(restarts.RESTART))
            return
        expectation = Expectation.of(case.expect, result)
        mismatches = expectation.mismatches
        verdict = "OK" if not mismatches else "MISMATCH"
        lines = [result.report(), "", f"expected {case.expect.describe()}, observed {result.outcome}: {verdict}"]
        print("\n".join(lines + [f"- {m}" for m in mismatches]), flush=True)
        if args.report:
            write_document(args.report, [result], nodeids=[args.spec], expectations=[expectation])
        code = 1 if not mismatches else 2
        restarts.record_final(run_store, EXIT_MATCHED if code == 1 else EXIT_MISMATCHED)
    except Exception:  # noqa: BLE001 - a judge failure still ends the world (verdict 3, every rank exits 1)
        traceback.print_exc()
    store.compare_set("verdict", "0", str(code))


def _verdict_published(store) -> bool:
    try:
        return int(store.multi_get(["verdict"])[0]) != 0
    except Exception:  # noqa: BLE001 - the store gone: the agent tore the world down, report what we can
        return False


def _run_case(case, plan: CaseRun, env: TorchrunEnv, store, events, keep_ports: set, shared_dir: str) -> None:
    """Run the case's function on this rank; publish its result (before the end event) and return."""
    import torch
    import torch.distributed as dist

    from ddpfaults.rank import flight, preempt, torch_private, tracing

    torch_private.load_dynamo()  # the first flight-recorder dump imports it (~1 s): at start-up, not the verdict
    from ddpfaults.rank.context import RankContext
    from ddpfaults.rank.job import run_job

    spec = plan.spec
    pg_backend = process_group_backend(spec.backend, env)
    ctx = RankContext(
        rank=env.rank, spec=spec, shared_dir=shared_dir, faults=plan.faults, events=events, attempt=env.restart
    )
    if spec.backend == "nccl":
        torch.cuda.set_device(env.local_rank)
        ctx.device = torch.device("cuda", env.local_rank)
    tracing.install_tracing()
    preempt.track_saves()

    group_store = dist.PrefixStore("pg", store.clone())  # this attempt's: never a dead attempt's (pytorch#135712)

    def init_process_group():
        dist.init_process_group(
            pg_backend,
            store=group_store,
            rank=env.rank,
            world_size=env.world_size,
            timeout=timedelta(seconds=spec.timeout + 30.0),
        )

    flight.enable()

    def publish(result):
        events.set(store, f"fr/{env.rank}", flight.dump() or b"")
        events.set(store, f"res/{env.rank}", pickle.dumps(result))

    load, init = (lambda: (case.scenario.fn, (), plan.kwargs)), init_process_group
    if case.scenario.script is not None:  # the script initialises its own group, from torchrun's environment
        from ddpfaults.rank import script, seams

        seams.install()
        script.use_store(group_store)
        target = script.ScriptTarget(
            case.scenario.script,
            None,
            plan.argv,
            os.getcwd(),
            case.scenario.step_clock,
            master_port=0,
            run_id=env.run_id,
        )
        load, init = (lambda: (script.run, (target,), {})), None
    result = run_job(
        ctx,
        load=load,
        init_process_group=init,
        publish=publish,
        still_reporting=lambda: not _verdict_published(store),
    )
    if result["error"] is not None and spec.peer_failure == "exit":
        events.emit("severed", sockets=sever_peer_sockets(keep_ports))


def main(argv=None) -> int:
    """A rank's life; returns only on a configuration error (otherwise the watchdog ends the process)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, HELD_SIGNALS)  # before any thread exists: every thread inherits it
    args = parse_args(argv)
    try:
        platform.require("worlds under torchrun")
        env = TorchrunEnv.from_environ()
        case = load_case(args.spec)
        plan = resolve_plan(case, env, args)
        process_group_backend(plan.spec.backend, env)
    except DDPFaultsError as exc:
        if os.environ.get("RANK", "0") == "0":
            print(restarts.config_error_text(exc, os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")), file=sys.stderr)
        return EXIT_CONFIG

    faulthandler.enable(file=sys.stderr, all_threads=True)
    store, run_store, keep_ports = connect_store(env, plan.spec.timeout + 30.0)
    final = restarts.ended_before(run_store, env)
    if final is not None:
        return final
    if env.rank == 0:
        store.set("t0", repr(T_START))
    store.compare_set("judge", "", "0")
    ensure_keys(store, ["verdict", "hb/0", *rank_keys(env.rank)])
    safe_id = re.sub(r"[^\w.-]", "_", f"{env.run_id}-{env.master_port}")  # every attempt's: its files carry over
    shared_dir = os.path.join(args.shared_dir or tempfile.gettempdir(), f"ddpfaults-torchrun-{safe_id}")
    os.makedirs(shared_dir, exist_ok=True)
    tmp = tempfile.gettempdir()
    output_dirs = [os.path.join(tmp, f"ddpfaults-torchrun-{safe_id}-{k}.output") for k in range(env.restart + 1)]
    output_dir = output_dirs[-1]
    os.makedirs(output_dir, exist_ok=True)
    output = os.path.join(output_dir, f"rank{env.rank}.err")
    tee_stderr(output)

    ending = run_store.clone()

    def cleanup():
        """Remove the node's output dir on the way out; unless torchrun restarts the world, its shared dir and the
        earlier attempts' output dirs too (any rank: after the verdict none needs them; one whose ranks all died)."""
        shutil.rmtree(output_dir, ignore_errors=True)
        if restarts.no_restart_follows(ending, env):
            for path in (shared_dir, *output_dirs[:-1]):
                shutil.rmtree(path, ignore_errors=True)

    def start_judge():
        """Start this rank's judge thread (it holds the seat)."""
        thread = threading.Thread(
            target=judge_world,
            args=(store.clone(), run_store.clone(), env, case, plan, args),
            name="ddpfaults-judge",
            daemon=True,
        )
        thread.start()
        return thread

    events = StoreEventLog(env.rank, store)
    watchdog = Watchdog(store.clone(), env, events, start_judge, cleanup)
    watchdog.start()
    threading.Thread(target=hold_signals, args=(watchdog,), name="ddpfaults-signals", daemon=True).start()
    events.emit(
        "start",
        pid=os.getpid(),
        host=socket.gethostname(),
        local_rank=env.local_rank,
        output=output,
        main_thread=threading.main_thread().ident,
    )
    _run_case(case, plan, env, store, events, keep_ports, shared_dir)
    threading.Event().wait()  # finished or failed: stay up (process group open) until the watchdog sees the verdict
    return EXIT_MISMATCHED  # not reached


if __name__ == "__main__":
    sys.exit(main())
