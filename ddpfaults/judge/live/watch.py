"""The launcher's view of a running rank: its event file, CPU time and Python stack."""

from __future__ import annotations

import os
import pickle
import re
import time

from ddpfaults import events, jobfiles
from ddpfaults.judge.deadlock import Op, family
from ddpfaults.judge.results import Collective, FiredFault
from ddpfaults.judge.verdict import innermost_frame

#: point-to-point calls, and which of a rank's counts each adds to (as :func:`ddpfaults.judge.p2p.begun` counts)
P2P_COUNTS = {"send": "sent", "isend": "sent", "recv": "received", "irecv": "received"}
OUTPUT_TAIL = 200  # lines of each rank's output kept in its result
#: how a dying rank's output says why, most telling first (gloo's mismatch abort, C++ enforce, any *Error)
DEATH_HINTS = [re.compile(p) for p in (r"collective mismatch", r"enforce fail", r"what\(\)", r"\w+(Error|Exception)\b")]


def frame_text(stack: str | None) -> str:
    """The innermost frame of a stack as ``"file", line N in f`` (for the "where" column)."""
    frame = innermost_frame(stack)
    return frame.replace("File ", "", 1) if frame else "unknown (no stack)"


def telling_line(output: str) -> str | None:
    """The line of a dead rank's output that best says why it died (None if nothing fits)."""
    lines = [line.strip() for line in output.splitlines() if not line.strip().startswith(("File ", "Fatal Python"))]
    for hint in DEATH_HINTS:
        found = [line for line in lines if hint.search(line)]
        if found:
            return found[-1][:300]
    return None


def tail(path: str, lines: int = OUTPUT_TAIL) -> str:
    """The last ``lines`` lines of a text file (at most its last 64 KiB); "" if it does not exist."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - 64 * 1024))
            text = f.read().decode(errors="replace")
    except FileNotFoundError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def cpu_seconds(pid: int, main: bool = False) -> float | None:
    """User+system CPU seconds of a process (``main``: of its main thread alone) from /proc (None if it is gone).

    A main thread blocked in a collective uses none at all, while the process's helper threads (the stack and flight
    record request thread) use a little: only the main thread's tells a rank that computes from one that waits."""
    try:
        with open(f"/proc/{pid}/task/{pid}/stat" if main else f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def demand_seconds(pid: int | None) -> float | None:
    """Seconds a process's main thread has spent running and waiting in a run queue to run (the first two fields of
    /proc/PID/task/PID/schedstat; None if the process is gone or the kernel keeps no such count)."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/task/{pid}/schedstat", "rb") as f:
            running, waiting = f.read().split()[:2]
        return (int(running) + int(waiting)) / 1e9
    except (OSError, ValueError):
        return None


#: where a rank's own frames end: the job runner (frames below it are the launcher's entry, never shown)
JOB_RUNNER = "ddpfaults/rank/job.py"


def main_thread(dump: str, ident: int | None = None) -> str:
    """The main thread (thread id ``ident``, else the one running a job) out of a faulthandler dump of all
    threads, innermost frame first, cut below the job runner's frame."""
    blocks = [b.strip() for b in re.split(r"\n(?=(?:Current thread|Thread) 0x)", dump) if b.strip()]

    def thread_id(block: str) -> int | None:
        found = re.match(r"(?:Current thread|Thread) (0x[0-9a-f]+)", block)
        return int(found.group(1), 16) if found else None

    chosen = [b for b in blocks if ident is not None and thread_id(b) == ident]
    chosen = chosen or [b for b in blocks if JOB_RUNNER in b]
    block = chosen[0] if chosen else (blocks[-1] if blocks else dump.strip())
    lines = block.splitlines()
    end = next((i for i, line in enumerate(lines) if JOB_RUNNER in line), len(lines) - 1)
    return "\n".join(lines[: end + 1])


class RankWatch:
    """The launcher's running view of one rank, built from its event file."""

    def __init__(self, rank: int, world_dir: str):
        self.rank = rank
        self.path = jobfiles.path(world_dir, rank, "events")
        self.stack_path = jobfiles.path(world_dir, rank, "stack")
        self.fd = None
        self.pending = b""
        self.events: list[dict] = []
        self.collectives: list[Collective] = []
        self.open: dict[int, Collective] = {}
        self.fired: list[FiredFault] = []
        self.step = None
        self.ended = None  # "finished" / "failed"
        self.joined = False  # its init_process_group returned (the rendezvous with every peer is done)
        self.leftovers = None  # state the job left behind in this rank (reported with "finished")
        self.last_progress = time.monotonic()
        self.cpu_at_progress = None
        self.exit_time = None
        self.stack = None
        self.main_ident = None  # the rank's main thread id (its "start" event), to pick it out of stack dumps
        self.entered: dict[int, dict] = {}  # the "enter" event of each call in ``open``
        self.finalizing = None  # the "ddp_finalize" event while the main thread waits for its DDP gradient buckets
        self.end = None  # the "finished" / "failed" event
        self.links_dropped = False  # its gloo connections were shut down (its peers read end-of-file)
        #: the default group's collectives its main thread entered, by number (a guess its flight record confirms)
        self.traced_ops: dict[int, Op] = {}
        #: likewise each other group's, by its identity (:func:`ddpfaults.events.group_key`)
        self.group_ops: dict[str, dict[int, Op]] = {}
        #: the sends to, and receives from, each peer it began (blocking or not), for the point-to-point proof
        self.sent: dict[int, int] = {}
        self.received: dict[int, int] = {}

    def read(self, pid: int | None) -> bool:
        """Consume new events; True if there were any."""
        if self.fd is None:
            try:
                self.fd = os.open(self.path, os.O_RDONLY)
            except FileNotFoundError:
                return False
        chunks = []
        while chunk := os.read(self.fd, 1 << 16):
            chunks.append(chunk)
        if not chunks:
            return False
        lines = (self.pending + b"".join(chunks)).split(b"\n")
        self.pending = lines.pop()
        for line in lines:
            self._apply(events.decode(line))
        if lines:
            self.last_progress = time.monotonic()
            self.cpu_at_progress = cpu_seconds(pid) if pid else None
        return bool(lines)

    def close(self) -> None:
        """Release the event file."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def _apply(self, event: dict) -> None:
        self.events.append(event)
        kind = event["k"]
        if kind != "exit":
            self.finalizing = None  # any other event is the main thread (or a thread it started) moving on
        if kind == "start":
            self.main_ident = event.get("main_thread")
        elif kind == "step":
            self.step = event["step"]
        elif kind == "enter":
            call = Collective(
                event["seq"],
                event["op"],
                event["shapes"],
                event["site"],
                event["step"],
                event.get("note", ""),
                batch=event.get("batch"),
                maker=event.get("maker", "user"),
                group=event.get("group"),
                members=event.get("members"),
            )
            if call.op not in ("init_process_group", "new_group") and not call.op.startswith("store."):
                self.collectives.append(call)  # waits that are not collectives are still "open" below
            self.open[call.seq] = call
            self.entered[call.seq] = event
            if isinstance(event.get("root"), int) and call.op in P2P_COUNTS:
                counts = self.sent if P2P_COUNTS[call.op] == "sent" else self.received
                counts[event["root"]] = counts.get(event["root"], 0) + 1
            if "thread" not in event and family(call.op) is not None:
                if call.group is None and event.get("pg_seq") is not None:
                    number = event["pg_seq"] + 1
                    self.traced_ops[number] = Op(number, family(call.op), event.get("root"))
                elif call.group is not None and event.get("group_seq") is not None:
                    number = event["group_seq"] + 1
                    op = Op(number, family(call.op), event.get("root"), call.group, tuple(call.members or ()))
                    self.group_ops.setdefault(call.group, {})[number] = op
        elif kind == "exit":
            self.entered.pop(event["seq"], None)
            call = self.open.pop(event["seq"], None)
            if call is not None:
                call.done = True
                self.joined = self.joined or call.op == "init_process_group"
        elif kind == "fault":
            self.fired.append(
                FiredFault(
                    event["index"],
                    event["fault"],
                    self.rank,
                    event.get("step"),
                    event["how"],
                    event.get("effect", ""),
                    event.get("signal"),
                    event.get("file"),
                )
            )
        elif kind in ("finished", "failed"):
            self.ended = kind
            self.leftovers = event.get("leftovers")
            self.end = event
        elif kind == "ddp_finalize":
            self.finalizing = event if self.open_buckets() else None
        elif kind == "links_dropped":
            self.links_dropped = True

    def waiting_in(self) -> Collective | None:
        """The innermost collective this rank entered and has not left."""
        return self.open[max(self.open)] if self.open else None

    def open_buckets(self) -> list[dict]:
        """The "enter" events of the DDP gradient buckets (ctx.ddp's) this rank issued and that have not completed."""
        return [e for e in self.entered.values() if e.get("maker") == "ddp_bucket"]


def read_dump(path: str) -> dict | None:
    """A rank's flight-record dump, unpickled from ``path``, for :mod:`ddpfaults.judge.flight` (None if there is none or
    it cannot be read)."""
    try:
        with open(path, "rb") as f:
            return pickle.load(f)
    except (OSError, EOFError, pickle.UnpicklingError):
        return None
