"""Step faults: what a rank does wrong when it announces a step (crash, straggle, skip, lone barrier).

The engine calls ``on_step`` when a rank announces a step the fault applies to, and
``skips_collective`` before each traced collective there.
"""

from __future__ import annotations

import math
import os
import pickle
import signal as signals
import time

from ddpfaults.errors import FaultError
from ddpfaults.events import MAKERS as MAKER_LABELS
from ddpfaults.faults.base import Fault, _require_rank, _require_step


class _OnOp(Fault):
    """A fault that may name the collective it acts on, ``op`` (None: any; see :func:`check_op`), and the process
    group it is made in, ``group`` (None: any; see :func:`check_group`)."""

    op: str | None = None
    group: str | tuple | None = None

    def matches(self, op: str, maker: str = "user") -> bool:
        """True if this fault acts on a collective ``op`` made by ``maker`` (its op or its maker's; any
        torch.distributed call without one)."""
        return op_matches(self.op, op, maker)

    def matches_at(self, ctx, op: str, maker: str = "user") -> bool:
        """:meth:`matches`, and the call is made in this fault's ``group`` (the rank context's ``call_group``: the
        members and ``group_desc`` of the call's process group, None for the default group)."""
        return self.matches(op, maker) and group_matches(self.group, getattr(ctx, "call_group", None))

    def acts_on_ddp_buckets(self, rank: int) -> bool:
        """An ``op="ddp_bucket"`` fault needs DDP's comm hook on its ranks."""
        return self.op == DDP_BUCKET and (self.ranks is None or rank in self.ranks)

    def _fields(self) -> dict:
        fields = super()._fields()
        if self.op is not None:
            fields["op"] = repr(self.op)
        if self.group is not None:
            fields["group"] = repr(list(self.group) if isinstance(self.group, tuple) else self.group)
        return fields


class _RankEnder(_OnOp):
    """A fault that ends its rank at its step: when the step starts, or with ``op`` as the rank enters its first
    collective ``op`` there (as for ``SkippedCollective``: ``"fsdp_reduce_scatter"``, ``"dcp"``, ``"all_reduce"``...;
    the rank dies inside the step, its peers already in or entering that collective)."""

    ends_rank = True

    @property
    def acts_on_step(self) -> bool:
        """It acts when its step starts unless it waits for a collective ``op``."""
        return self.op is None

    def end(self, ctx) -> None:
        """End the rank (what the kind does)."""
        raise NotImplementedError

    def on_step(self, ctx) -> None:
        """End the rank as its step starts (without ``op``)."""
        self.end(ctx)

    def before_collective(self, ctx, op: str, maker: str = "user") -> str | None:
        """End the rank as it enters its first collective ``op`` of the step (recorded first: it does not return)."""
        if self.op is None or not (self.matches_at(ctx, op, maker) and ctx.once(self)):
            return None
        made = f" ({MAKER_LABELS[maker]})" if maker != "user" else ""
        ctx.record_fired(self, f"entering {op}{made}", effect="at_collective", signal=self.kills_with)
        self.end(ctx)
        return None


class RankCrash(_RankEnder):
    """``rank`` raises ``exc`` when it announces ``step`` (with ``op``: as it enters its first collective ``op`` of
    that step).

    ``exc`` is an exception instance or class (default ``RuntimeError("injected crash")``; a class is built
    with the message ``"injected crash"``); it must survive pickling, since it travels to the rank.
    """

    def __init__(self, *, rank, step, exc: BaseException | type | None = None, op: str | None = None):
        super().__init__(rank=rank, step=step)
        _require_rank(self)
        _require_step(self)
        self.op = check_op("RankCrash", op)
        if exc is None:
            exc = RuntimeError("injected crash")
        if isinstance(exc, type) and issubclass(exc, BaseException):
            try:
                exc = exc("injected crash")
            except Exception as error:  # noqa: BLE001 - any failure to build it is the caller's bad argument
                raise FaultError(
                    f"RankCrash: exc={exc.__name__} cannot be built as {exc.__name__}('injected crash') "
                    f"({type(error).__name__}: {error}); pass an instance"
                ) from None
        if not isinstance(exc, BaseException):
            raise FaultError(f"RankCrash: exc must be an exception instance or class, got {exc!r}")
        try:
            if type(pickle.loads(pickle.dumps(exc))) is not type(exc):
                raise TypeError("it comes back as another type")
        except Exception as error:  # noqa: BLE001 - pickling fails in many ways; every one is a bad argument
            raise FaultError(
                f"RankCrash: exc={exc!r} cannot travel to the rank: pickling it fails ({type(error).__name__}: "
                f"{error}); use an exception class defined at module level whose arguments rebuild it"
            ) from None
        self.exc = exc

    def end(self, ctx) -> None:
        """Raise the configured exception."""
        raise self.exc

    def _fields(self) -> dict:
        fields = super()._fields()
        op = fields.pop("op", None)
        fields["exc"] = f"{type(self.exc).__name__}({', '.join(map(repr, self.exc.args))})"
        return {**fields, **({"op": op} if op else {})}


#: signals that do not end a process by default (ignored, or stop/continue it): none of them kills a rank
NOT_KILLING = frozenset(
    getattr(signals, name)
    for name in ("SIGCHLD", "SIGCONT", "SIGURG", "SIGWINCH", "SIGSTOP", "SIGTSTP", "SIGTTIN", "SIGTTOU")
    if hasattr(signals, name)
)


class RankKilled(_RankEnder):
    """``rank``'s process is killed by ``signal`` (default SIGKILL) when it announces ``step`` (with ``op``: as it
    enters its first collective ``op`` of that step): an OOM kill, a preempted node, a worker killed by hand. It
    leaves no Python traceback; the judge reports how it died. ``signal`` must be one whose default action ends a
    process (not SIGCHLD, SIGSTOP, ...)."""

    def __init__(self, *, rank, step, signal: int = signals.SIGKILL, op: str | None = None, group=None):
        super().__init__(rank=rank, step=step)
        _require_rank(self)
        _require_step(self)
        self.op = check_op("RankKilled", op)
        self.group = check_group("RankKilled", group)
        if self.group is not None and self.op is None:
            raise FaultError("RankKilled: group needs op (the collective in that group to kill the rank entering)")
        try:
            if isinstance(signal, bool) or not isinstance(signal, int):
                raise ValueError(signal)
            self.signal = signals.Signals(signal)
        except ValueError:
            raise FaultError(
                f"RankKilled: signal must be a signal number like signal.SIGKILL, got {signal!r}"
            ) from None
        if self.signal in NOT_KILLING:
            raise FaultError(
                f"RankKilled: signal {self.signal.name} does not kill a rank (it is ignored, or stops or "
                f"continues it); use SIGKILL, SIGTERM, SIGINT, SIGABRT, SIGSEGV, SIGBUS..."
            )

    @property
    def kills_with(self) -> str:
        """The name of the signal it sends its rank."""
        return self.signal.name

    def end(self, ctx) -> None:
        """Send the signal to this rank's own process."""
        os.kill(os.getpid(), self.signal)  # returns only if the code under test handles the signal

    def _fields(self) -> dict:
        fields = super()._fields()
        op = fields.pop("op", None)
        if self.signal != signals.SIGKILL:
            fields["signal"] = f"signal.{self.signal.name}"
        return {**fields, **({"op": op} if op else {})}


class Straggler(Fault):
    """``rank`` computes hard (burning CPU, not sleeping) for ``seconds`` at ``step``."""

    def __init__(self, *, rank, step, seconds: float):
        super().__init__(rank=rank, step=step)
        _require_rank(self)
        _require_step(self)
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 < seconds < math.inf:
            raise FaultError(f"Straggler: seconds must be a positive finite number, got {seconds!r}")
        self.seconds = float(seconds)

    def on_step(self, ctx) -> None:
        """Busy-loop on the CPU for the configured time."""
        end = time.monotonic() + self.seconds
        x = 0
        while time.monotonic() < end:
            for i in range(10_000):
                x += i * i

    def _fields(self) -> dict:
        return {**super()._fields(), "seconds": repr(self.seconds)}


#: the torch.distributed functions a rank traces (and SkippedCollective can skip), by name
COLLECTIVE_OPS = (
    "all_reduce",
    "all_reduce_coalesced",
    "broadcast",
    "reduce",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_single",
    "all_gather_object",
    "gather",
    "gather_object",
    "scatter",
    "scatter_object_list",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "reduce_scatter_single",
    "all_to_all",
    "all_to_all_single",
    "broadcast_object_list",
    "barrier",
    "monitored_barrier",
    "send",
    "recv",
    "isend",
    "irecv",
)
#: SkippedCollective's ``op`` for the all_reduce of a DDP gradient bucket (made by DDP's reducer, not a call)
DDP_BUCKET = "ddp_bucket"
#: the ``op`` of a fault on the collectives a library makes itself (a maker of :data:`ddpfaults.events.MAKERS`):
#: FSDP2's parameter all-gathers and gradient reduce-scatters, and every collective of Distributed Checkpoint
LIBRARY_OPS = ("fsdp_all_gather", "fsdp_reduce_scatter", "dcp")


def check_group(owner: str, group) -> str | tuple | None:
    """``group`` as a fault keeps it: None (any process group), a DeviceMesh dimension's name or a group's
    ``group_desc`` (``"tp"``), or its member ranks (a list of distinct ranks, kept sorted as a tuple); FaultError
    naming ``owner`` otherwise."""
    if group is None:
        return None
    if isinstance(group, str):
        if not group.strip():
            raise FaultError(f"{owner}: group must be a mesh dimension name or a list of ranks, got {group!r}")
        return group
    if isinstance(group, (list, tuple)) and group:
        if all(isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in group) and len(set(group)) == len(
            group
        ):
            return tuple(sorted(group))
    raise FaultError(
        f"{owner}: group must be a mesh dimension name ('tp') or a list of distinct non-negative ranks ([0, 1]), "
        f"got {group!r}"
    )


def group_matches(group, call_group) -> bool:
    """True if a fault's ``group`` (:func:`check_group`) names ``call_group``, the ``(members, desc)`` of the call's
    process group (None: the default group, which only a fault without ``group`` acts in)."""
    if group is None:
        return True
    if call_group is None:
        return False
    members, desc = call_group
    if isinstance(group, str):
        return desc in (group, f"mesh_{group}")
    return tuple(sorted(members or ())) == group


def check_op(owner: str, op) -> str | None:
    """``op`` if it is None, ``"ddp_bucket"``, a library's (:data:`LIBRARY_OPS`) or a traced torch.distributed
    collective; a FaultError otherwise."""
    if op is not None and op not in (*COLLECTIVE_OPS, DDP_BUCKET, *LIBRARY_OPS):
        raise FaultError(
            f"{owner}: op must be None, {DDP_BUCKET!r}, one of {', '.join(map(repr, LIBRARY_OPS))} or a "
            f"torch.distributed collective ({', '.join(COLLECTIVE_OPS)}), got {op!r}"
        )
    return op


def op_matches(mine: str | None, op: str, maker: str = "user") -> bool:
    """True if a fault of op ``mine`` acts on collective ``op`` made by ``maker`` (a key of
    :data:`ddpfaults.events.MAKERS`): its name or its maker's (``"fsdp_all_gather"``); None: any torch.distributed
    call (whoever made it), never a DDP bucket."""
    if mine is None:
        return op != DDP_BUCKET
    return op == mine or (mine in LIBRARY_OPS and maker == mine)


def ops_overlap(a: str | None, b: str | None) -> bool:
    """True if faults of ops ``a`` and ``b`` can act on one collective: equal; None and anything but a DDP bucket;
    a library's op and a torch.distributed op (the library makes such calls)."""
    if a == b:
        return True
    ops = {a, b}
    if DDP_BUCKET in ops:
        return False
    return None in ops or len(ops & set(LIBRARY_OPS)) == 1


class CollectiveFault(_OnOp):
    """A fault acting on the first collective ``op`` of ``rank`` at ``step`` (``op``: a torch.distributed
    function name, ``"ddp_bucket"`` for a DDP gradient bucket's all_reduce, ``"fsdp_all_gather"``,
    ``"fsdp_reduce_scatter"`` or ``"dcp"`` for a collective FSDP2 or Distributed Checkpoint makes, or None for any
    torch.distributed call).
    """

    def __init__(self, *, rank, step, op: str | None = None, group=None):
        super().__init__(rank=rank, step=step)
        _require_rank(self)
        _require_step(self)
        self.op = check_op(type(self).__name__, op)
        self.group = check_group(type(self).__name__, group)


class SkippedCollective(CollectiveFault):
    """``rank`` silently skips the first collective at ``step``, or the first of kind ``op``.

    ``op`` is a torch.distributed function name (``"all_reduce"``, ``"barrier"``, ...) or ``"ddp_bucket"``: the
    all_reduce of a DDP gradient bucket in ``backward`` (plain DDP or ``ctx.ddp``; the rank keeps its own
    gradients for that bucket), ``"fsdp_all_gather"`` / ``"fsdp_reduce_scatter"`` (an FSDP2 parameter all-gather
    or gradient reduce-scatter: the rank goes on with its buffer unfilled) or ``"dcp"`` (a collective of
    ``dcp.save``/``dcp.load``). Without ``op``, the first torch.distributed call is skipped, never a bucket.
    """

    def skips_collective(self, ctx, op: str, maker: str = "user") -> bool:
        """Skip once per (rank, step): the first matching collective."""
        return self.matches_at(ctx, op, maker) and ctx.once(self)

    def unfired_hint(self, calls: list) -> str:
        """The collectives its step had, when none was one it skips: DDP's buckets only (``op='ddp_bucket'`` skips
        one), other ops, or none."""
        if any(self.matches(call.op) and call.maker == "user" for call in calls):
            return ""
        if self.op is None and any(call.maker == "ddp_bucket" for call in calls):
            return (
                "its step's only collectives were DDP's gradient-bucket all_reduces, which a SkippedCollective "
                "without op never skips: give op='ddp_bucket' to skip one"
            )
        made = sorted({call.op for call in calls if call.maker == "user"})
        if made:
            return f"its step had no {self.op} (the code called {', '.join(made)})"
        return "its rank made no collective of its own at its step" + (
            ": give op='ddp_bucket' to skip a DDP gradient bucket" if self.op is None else ""
        )

    def same_effect(self, other: Fault) -> str | None:
        """Two skips whose ops overlap both claim the first matching collective."""
        if not isinstance(other, SkippedCollective):
            return None
        if ops_overlap(self.op, other.op):
            return f"skip the first {self.op or other.op or 'collective'}"
        return None


class RankOnlyBarrier(Fault):
    """``rank`` alone calls ``dist.barrier()`` at ``step`` (e.g. ``if rank == 0: dist.barrier()``): the step's
    first collective on that rank."""

    def __init__(self, *, rank, step):
        super().__init__(rank=rank, step=step)
        _require_rank(self)
        _require_step(self)

    def on_step(self, ctx) -> None:
        """Enter a barrier the other ranks never call."""
        import torch.distributed as dist

        dist.barrier()

    def same_effect(self, other: Fault) -> str | None:
        """Two lone barriers (the rank waits in the first), or a skip that would swallow the lone barrier."""
        if isinstance(other, RankOnlyBarrier):
            return "call the lone barrier"
        if isinstance(other, SkippedCollective) and other.matches("barrier"):
            return "act on the step's first barrier (the skip would swallow the lone barrier)"
        return None


class Preempt(Fault):
    """At ``step`` the ``ranks`` (default: every rank) get ``signal`` (default SIGTERM) as a scheduler sends it to a
    preempted job, and SIGKILL ``grace`` seconds later if still running (Slurm's ``KillWait``, Kubernetes'
    ``terminationGracePeriodSeconds``). A rank without a handler dies of the signal; one with a handler may save and
    stop in time. The report says which ranks handled it, whether they saved and how many steps were lost; with
    ``max_restarts`` the world is restarted after it, as the scheduler requeues the job."""

    rank_arg = "ranks"

    def __init__(self, *, step, ranks=None, grace: float = 5.0, signal: int = signals.SIGTERM):
        super().__init__(rank=ranks, step=step)
        _require_step(self)
        if len(self.steps) != 1:
            raise FaultError(f"Preempt: step must be one step (a job is preempted once), got {step!r}")
        if isinstance(grace, bool) or not isinstance(grace, (int, float)) or not 0 < grace < math.inf:
            raise FaultError(f"Preempt: grace must be a positive finite number of seconds, got {grace!r}")
        try:
            if isinstance(signal, bool) or not isinstance(signal, int):
                raise ValueError(signal)
            self.signal = signals.Signals(signal)
        except ValueError:
            raise FaultError(f"Preempt: signal must be a signal number like signal.SIGTERM, got {signal!r}") from None
        if self.signal in NOT_KILLING or self.signal == signals.SIGKILL:
            raise FaultError(
                f"Preempt: signal {self.signal.name} cannot be a preemption notice (a scheduler sends one a rank may "
                f"handle: SIGTERM, SIGINT, SIGUSR1...); for a kill without notice use RankKilled"
            )
        self.grace = float(grace)

    def same_effect(self, other: Fault) -> str | None:
        """Two preemptions of one rank at one step: one notice."""
        return "preempt the rank" if isinstance(other, Preempt) else None

    def _fields(self) -> dict:
        fields = {**super()._fields(), "grace": f"{self.grace:g}"}
        if self.signal != signals.SIGTERM:
            fields["signal"] = f"signal.{self.signal.name}"
        return fields
