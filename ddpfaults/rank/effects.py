"""What a fault does inside a rank, for the kinds whose effect needs the rank's machinery: the one place each such
kind's rank-side effect lives (the faults never import the rank side; a fault value names its kind, the rank side
looks the effect up here).

- ``OutOfMemory``: the rank's address space is limited when its step starts (:mod:`ddpfaults.rank.memory`), and
  lifted when its next step starts or its job ends; it fires when an allocation fails under the limit;
- the checkpoint faults (:mod:`ddpfaults.rank.checkpoint`): the writer watches the files it writes in the fault's
  step (the rank's file record) and acts on the one complete as it moves on (a file event, a collective, the next
  step, the job's end): ``WriterKilledMidSave`` cuts it and kills the writer, ``TornCheckpointWrite`` holds it cut
  until every reader moved on (a reader's reads wait for it; every armed rank publishes its process groups' count
  of calls, read by a thread while it waits in one, so neither side waits for a peer blocked in a collective);
- the DCP faults (``TornDcpWrite``, ``CheckpointNotVisible``, ``AsyncSaveKilled``): ``os.fsync``, ``os.rename``,
  ``os.path``'s existence checks, ``os.listdir`` and ``dcp.async_save`` are wrapped when their step starts
  (:mod:`ddpfaults.rank.dcp`);
- ``DroppedLink``: the rank's gloo connections are shut down as it enters the collective
  (:mod:`ddpfaults.rank.links`), and it raises :class:`~ddpfaults.faults.LinkDropped` there;
- ``Preempt``: the rank gets its notice when its step starts, and SIGKILL after the grace period if its job still
  runs (:mod:`ddpfaults.rank.preempt`).

Every other kind carries its effect in its own hooks (:class:`~ddpfaults.faults.Fault`'s ``arm``, ``on_step``,
``skips_collective``, ``before_collective``, ``on_batch``...): the functions below fall back to them, so the rank
context and the job runner call one function per moment and know no kind.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ddpfaults.faults import DroppedLink, LinkDropped, OutOfMemory, Preempt, TornCheckpointWrite, WriterKilledMidSave
from ddpfaults.faults.dcp import AsyncSaveKilled, CheckpointNotVisible, TornDcpWrite
from ddpfaults.faults.memory import MARGIN
from ddpfaults.rank import checkpoint, dcp, links, memory, preempt

SENDS = ("send", "isend")  # point-to-point calls that wait for no peer's part before their data is on its way


@dataclass(frozen=True)
class Effect:
    """A kind's effect at each moment of a rank (None: the fault's own hook): ``arm(ctx, fault)`` when a step it
    applies to starts, ``skips_collective(ctx, fault, op)`` and ``before_collective(ctx, fault, op)`` as the rank
    enters a collective where it applies."""

    arm: Callable | None = None
    skips_collective: Callable | None = None
    before_collective: Callable | None = None


def _limit_memory(ctx, fault: OutOfMemory) -> None:
    """Limit the rank's address space (lifted when its next step starts, or its job ends); the fault fires when an
    allocation fails under the limit (a step that stays below it is left unchanged, and the fault unfired)."""
    done = memory.limit(MARGIN)
    if done is None:
        ctx.record_fired(fault, "raised MemoryError: the address space could not be limited", effect="memory")
        raise MemoryError("injected out of memory (the address space could not be limited)")
    memory.watch(
        lambda error: ctx.record_fired(fault, f"{done}; an allocation failed under it: {error}", effect="memory")
    )


def _file_complete(ctx, fault: WriterKilledMidSave, op: str, maker: str = "user") -> None:
    """The writer entering a collective has completed the file it was writing: cut it and die there."""
    checkpoint.window_ends(ctx)


def _intercept_dcp(ctx, fault) -> None:
    """Route this process's fsyncs, existence checks and ``dcp.async_save`` through the DCP faults (idempotent). Not
    an effect yet: the fault fires when it tears, hides or kills."""
    dcp.install()


def _torn_collective(ctx, fault: TornCheckpointWrite, op: str, maker: str = "user") -> bool:
    """A rank entering a collective or a receive at a torn step: the writer's file is complete (held torn there), and
    the rank publishes its count (a held writer stops waiting for a reader blocked there, a reader for a writer); it
    skips nothing. Sends are not counted on any rank: a reader's receive waits for a send the held writer has yet to
    make (counted, a writer's three isends to its readers put it ahead of each reader's one recv, and a second torn
    step was held the 30 s limit; not counting the receive held every torn step that long)."""
    checkpoint.entering(ctx, op, counted=op not in SENDS)
    return False


def _drop_links(ctx, fault: DroppedLink, op: str, maker: str = "user") -> str | None:
    """Shut down the rank's gloo connections and raise :class:`LinkDropped` at the first matching collective."""
    if not (fault.matches_at(ctx, op, maker) and ctx.once(fault)):
        return None
    dropped = links.drop_all()
    if not dropped:
        return None
    # its peers read end-of-file, whether the rank lives on or not: the judge never counts on it to keep them waiting
    ctx._events.emit("links_dropped", count=dropped, step=ctx.current_step)
    ctx.record_fired(fault, f"shut down its {dropped} gloo connection(s) entering {op}", effect="at_collective")
    raise LinkDropped(f"rank {ctx.rank}'s links to its peers dropped entering {op} (injected by {fault!r})")


#: the kinds whose effect lives here (a subclass takes its nearest base's)
EFFECTS = {
    OutOfMemory: Effect(arm=_limit_memory),
    WriterKilledMidSave: Effect(arm=checkpoint.kill_mid_file, before_collective=_file_complete),
    TornCheckpointWrite: Effect(arm=checkpoint.tear_mid_file, skips_collective=_torn_collective),
    DroppedLink: Effect(before_collective=_drop_links),
    Preempt: Effect(arm=preempt.deliver),
    TornDcpWrite: Effect(arm=_intercept_dcp),
    CheckpointNotVisible: Effect(arm=_intercept_dcp),
    AsyncSaveKilled: Effect(arm=_intercept_dcp),
}


def _effect(fault) -> Effect:
    return next((EFFECTS[kind] for kind in type(fault).__mro__ if kind in EFFECTS), Effect())


def arm(ctx, fault) -> None:
    """A step ``fault`` applies to starts on ``ctx``'s rank: prepare its effect (before any fault acts there)."""
    hook = _effect(fault).arm
    hook(ctx, fault) if hook is not None else fault.arm(ctx)


def skips_collective(ctx, fault, op: str, maker: str = "user") -> bool:
    """True if ``fault`` makes ``ctx``'s rank skip collective ``op`` made by ``maker`` (where it applies)."""
    hook = _effect(fault).skips_collective
    return hook(ctx, fault, op, maker) if hook is not None else fault.skips_collective(ctx, op, maker)


def before_collective(ctx, fault, op: str, maker: str = "user") -> str | None:
    """What ``fault`` did as ``ctx``'s rank entered collective ``op`` made by ``maker`` (where it applies, unless
    skipped); None."""
    hook = _effect(fault).before_collective
    return hook(ctx, fault, op, maker) if hook is not None else fault.before_collective(ctx, op, maker)


def step_starts() -> None:
    """A rank's next step starts: what an effect holds only until then ends (an ``OutOfMemory`` limit, the file a
    ``WriterKilledMidSave`` writer was writing)."""
    memory.restore()
    checkpoint.window_ends()


def job_ends() -> None:
    """A rank's job ends (returned or raised): what an effect holds within a job ends, before the job's report (an
    ``OutOfMemory`` limit must not stop it; a warm rank runs the next job unlimited; a ``WriterKilledMidSave``
    writer's file is complete)."""
    memory.restore()
    checkpoint.window_ends(closing=True)
