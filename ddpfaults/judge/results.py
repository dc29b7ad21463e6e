"""Results are data: plain, serialisable objects describing a world and each of its ranks."""

from __future__ import annotations

import enum
import json
import os
import re
import shlex
import sys
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from ddpfaults.events import SITELESS_MAKERS


class Outcome(str, enum.Enum):
    """The verdict of a world or a rank. Its values are the strings users write in ``expect=``."""

    COMPLETED = "completed"  # every rank's function returned
    HUNG = "hung"  # stopped while stuck: no progress, ranks waiting on each other (or on a rank that never came)
    CRASHED = "crashed"  # a rank raised or died and the world ended
    TIMED_OUT = "timed out"  # the hard timeout came while the ranks were still making progress: no one at fault

    def __str__(self) -> str:
        return self.value


class RankState(str, enum.Enum):
    """How a rank stood when the world was judged (finer than its outcome)."""

    FINISHED = "finished"  # fn returned; the rank waited, process group open, for the verdict
    RAISED = "raised"  # fn raised; the rank reported its error (then exited or lingered)
    DIED = "died"  # the process ended without reporting (signal, os._exit, crash in C++)
    BLOCKED = "blocked"  # alive, waiting on its peers (collective, DDP reduction, barrier, store)
    RUNNING = "running"  # alive, outside any collective (computing, sleeping) when the world was stopped

    def __str__(self) -> str:
        return self.value


_STATE_OUTCOME = {
    RankState.FINISHED: Outcome.COMPLETED,
    RankState.RAISED: Outcome.CRASHED,
    RankState.DIED: Outcome.CRASHED,
    RankState.BLOCKED: Outcome.HUNG,
    RankState.RUNNING: Outcome.HUNG,
}


#: ops that pair two ranks (a send on one, a recv on the other, as many as the pattern needs): not compared
#: position by position across all ranks
POINT_TO_POINT = frozenset({"send", "recv", "isend", "irecv", "batch_isend_irecv"})

#: collectives whose arguments legitimately differ between ranks: a list of tensors or objects on the source (or
#: destination) rank only, or uneven splits; they match on op, group, call site and step, not on shapes
ASYMMETRIC = frozenset(
    "scatter gather scatter_object_list gather_object broadcast_object_list all_to_all all_to_all_single".split()
)


@dataclass
class Collective:
    """One traced collective call on one rank."""

    seq: int
    op: str
    shapes: list
    site: str
    step: int | None
    note: str = ""  # e.g. "DDP gradient bucket 0"
    done: bool = False
    wall: float | None = None  # flight recorder: when the rank issued it (Unix seconds); None for a traced call
    wall_end: float | None = None  # flight recorder: when it was seen completed (NCCL; gloo records no end)
    batch: int | None = None  # the rank's last DataLoader batch (its n-th, from 0) drawn before the call, if any
    maker: str = "user"  # who made it: one of ddpfaults.events.MAKERS (the user's code, DDP's buckets, FSDP, DCP...)
    group: str | None = None  # the process group's id when not the default group

    def describe(self) -> str:
        """``all_reduce([1]) at criterion.py:42 in loss (step 3)``."""
        shapes = ", ".join(str(s) for s in self.shapes)
        note = f" [{self.note}]" if self.note else ""
        step = f" (step {self.step})" if self.step is not None else ""
        return f"{self.op}({shapes}){note} at {self.site}{step}"

    def signature(self) -> tuple:
        """What must agree across ranks for the call to match. A call DDP or FSDP makes itself (a maker of
        :data:`~ddpfaults.events.SITELESS_MAKERS`) has no site of its own: the line that called forward or backward
        may differ while the call matches; an :data:`ASYMMETRIC` call's shapes differ between its source and the
        other ranks by design."""
        site = "" if self.maker in SITELESS_MAKERS else self.site
        shapes = "" if self.op in ASYMMETRIC else json.dumps(self.shapes)
        return (self.op, shapes, self.note, site, self.step)


@dataclass(frozen=True)
class FiredFault:
    """A fault of the plan taking effect on a rank: which fault (its index in the plan, and its repr), where,
    at which step, and what it did."""

    index: int
    fault: str
    rank: int
    step: int | None
    how: str
    effect: str = ""  # what it did, as data: one of ddpfaults.events.EFFECTS
    signal: str | None = None  # the signal it killed its rank with, if it did

    def describe(self) -> str:
        """``RankCrash(rank=1, step=2) fired on rank 1 at step 2 (on_step)``."""
        step = f" at step {self.step}" if self.step is not None else ""
        return f"{self.fault} fired on rank {self.rank}{step} ({self.how})"


@dataclass(frozen=True)
class UnfiredFault:
    """A fault of the plan that never took effect on any rank: which (its index in the plan, and its repr), and
    ``finished``: the ranks it targets that finished their function normally all the same.

    Those ranks gave it every chance (its step, batch, save or collective never came there), so a non-empty
    ``finished`` is an error (:attr:`had_chance`); with none, every rank it targets raised, died or was still
    running or blocked at the verdict, and its moment may simply never have come."""

    index: int
    fault: str
    finished: tuple = ()

    @property
    def had_chance(self) -> bool:
        """True if a rank it targets finished its function without it taking effect."""
        return bool(self.finished)

    def describe(self) -> str:
        """``EmptyBatch(rank=1, step=9) never fired, though rank 1 finished its function``."""
        if self.had_chance:
            return f"{self.fault} never fired, though {format_ranks(self.finished)} finished without it taking effect"
        return f"{self.fault} never fired (no rank it targets finished its function: they raised, died or stalled)"


def format_ranks(ranks) -> str:
    """``rank 2`` / ``ranks 0, 1, 3`` / ``ranks 0-8, 10-15`` (runs of three or more collapsed)."""
    ranks = sorted(ranks)
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    runs, start = [], 0
    for i in range(1, len(ranks) + 1):
        if i == len(ranks) or ranks[i] != ranks[i - 1] + 1:
            run = ranks[start:i]
            runs += [f"{run[0]}-{run[-1]}"] if len(run) > 2 else [str(r) for r in run]
            start = i
    return "ranks " + ", ".join(runs)


@dataclass(frozen=True)
class DivergenceGroup:
    """Ranks that agree at the divergent position: they all made ``call``, or (``call`` None) made none there,
    for the reason ``absent`` gives (``finished``, their error, where they stood)."""

    ranks: tuple
    call: Collective | None = None
    absent: str | None = None

    def text(self) -> str:
        """``called all_reduce([4]) at f.py:3 in g (step 1)`` or ``never called it (finished)``."""
        return f"called {self.call.describe()}" if self.call is not None else f"never called it ({self.absent})"


@dataclass(frozen=True)
class Divergence:
    """The first position in the collective sequences where the ranks disagree."""

    index: int  # 1-based collective number
    groups: tuple  # DivergenceGroup, largest group first
    odd_ranks: tuple  # the rank(s) that diverged, as the evidence shows; () when nothing shows which
    basis: str = ""  # what shows it, when more than a majority does (ddpfaults.judge.attribution)

    def describe(self) -> str:
        """``collective #5: rank 0 called ...; ranks 1-3 called ...``."""
        return f"collective #{self.index}: " + "; ".join(f"{format_ranks(g.ranks)} {g.text()}" for g in self.groups)

    def blame(self) -> str:
        """One sentence naming the odd rank(s) and what they did instead, and what shows it (for the root cause);
        or, when nothing shows which ranks diverged, that the ranks disagree and how."""
        if not self.odd_ranks:
            everyone = [r for g in self.groups for r in g.ranks]
            return (
                f"{format_ranks(everyone)} disagree at collective #{self.index} and nothing shows which diverged: "
                + "; ".join(f"{format_ranks(g.ranks)} {g.text()}" for g in self.groups)
            )
        odd_group = next(g for g in self.groups if set(g.ranks) <= set(self.odd_ranks))
        main = next(g for g in self.groups if not set(g.ranks) & set(self.odd_ranks))
        odd = format_ranks(self.odd_ranks)
        shows = f" ({self.basis})" if self.basis else ""
        if odd_group.call is None and main.call is not None:
            return (
                f"{odd} never called collective #{self.index}, {main.call.describe()} ({odd_group.absent}); "
                f"{format_ranks(main.ranks)} called it{shows}"
            )
        return (
            f"{odd} {odd_group.text()} as collective #{self.index}, where {format_ranks(main.ranks)} "
            f"{main.text()}{shows}"
        )

    def ops(self) -> set:
        """The collectives (``all_reduce``, ``barrier``...) the ranks made at the divergent position."""
        return {g.call.op for g in self.groups if g.call is not None}

    @classmethod
    def from_dict(cls, data: dict) -> Divergence:
        """Inverse of ``dataclasses.asdict``."""
        groups = tuple(
            DivergenceGroup(tuple(g["ranks"]), Collective(**g["call"]) if g["call"] else None, g["absent"])
            for g in data["groups"]
        )
        return cls(data["index"], groups, tuple(data["odd_ranks"]), data.get("basis", ""))


@dataclass
class RankResult:
    """What one rank did. ``outcome`` is derived from ``state``."""

    rank: int
    state: RankState
    pid: int | None = None
    value: Any = None
    error: str | None = None
    traceback: str | None = None
    site: str | None = None  # where the error was raised (file:line in func)
    collateral: bool = False  # the error is a consequence of another rank's failure
    exitcode: int | None = None
    stack: str | None = None  # the main thread's Python stack when the rank was found blocked/running
    where: str | None = None  # where a live rank stood at the verdict (collective or innermost frame)
    last_step: int | None = None
    failed_at: float | None = None  # seconds since world start when the rank raised or died
    collectives: list[Collective] = field(default_factory=list)
    fired: list[FiredFault] = field(default_factory=list)
    recorder: str = "tracing"  # where ``collectives`` came from: torch's "flight recorder", or ddpfaults' tracing
    output: str = ""  # the captured stdout+stderr (tail)
    events: list[dict] = field(default_factory=list)  # timeline, t in seconds since world start
    timed_out: bool = False  # still running (or blocked) when its world timed out while making progress

    @property
    def outcome(self) -> Outcome:
        """completed / hung / crashed for this rank, by its state; timed out for a rank still live in a world that
        timed out."""
        if self.timed_out and RankState(self.state) in (RankState.BLOCKED, RankState.RUNNING):
            return Outcome.TIMED_OUT
        return _STATE_OUTCOME[RankState(self.state)]

    def to_dict(self) -> dict:
        """A JSON-ready dict (the value is kept if JSON can hold it, else its repr)."""
        data = asdict(self)
        data["state"] = str(self.state)
        data["outcome"] = str(self.outcome)
        try:
            json.dumps(self.value)
        except (TypeError, ValueError):
            data["value"] = repr(self.value)
        return data

    @classmethod
    def from_dict(cls, data: dict) -> RankResult:
        """Inverse of :meth:`to_dict` (values that were repr'd stay strings)."""
        known = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in known}
        kwargs["state"] = RankState(kwargs["state"])
        kwargs["collectives"] = [Collective(**c) for c in kwargs.get("collectives", [])]
        kwargs["fired"] = [FiredFault(**f) for f in kwargs.get("fired", [])]
        return cls(**kwargs)


@dataclass
class WorldResult:
    """What a world did: its verdict, why, and every rank's result in rank order."""

    outcome: Outcome
    ranks: list[RankResult]
    root_cause: str
    root_rank: int | None
    reason: str  # how the verdict was reached
    elapsed: float
    world_size: int
    seed: int
    backend: str = "gloo"
    peer_failure: str = "exit"
    start_method: str = "forkserver"
    stall: float = 0.0
    timeout: float = 0.0
    startup: float | None = None  # the start-up limit, when not the default
    divergence: Divergence | None = None
    faults: list[str] = field(default_factory=list)
    fired: list[FiredFault] = field(default_factory=list)
    unfired: list[UnfiredFault] = field(default_factory=list)  # faults of the plan that never took effect
    function: str = ""  # file.py:name of a rank function, or the script (train.py, -m pkg.module) of a script world
    kwargs: str = ""  # repr of the keyword arguments the function got (a script's argv), for the replay line
    step_clock: str = "ctx.step"  # who started steps: ctx.step, or a script world's optimizer / dataloader seam
    replay: str | None = None
    events: list[dict] = field(default_factory=list)  # launcher-side: stall began, verdict (t since start)
    flight_records: str | None = None  # the folder holding every rank's flight-recorder dump, if kept
    warm: bool = False  # ran on a warm (reused) world
    reused: bool = False  # went back to the pool for the next run

    @property
    def values(self) -> list:
        """Each rank's return value, in rank order."""
        return [r.value for r in self.ranks]

    def to_dict(self) -> dict:
        """A JSON-ready dict of the whole world."""
        data = asdict(self)
        data["outcome"] = str(self.outcome)
        data["ranks"] = [r.to_dict() for r in self.ranks]
        data["divergence"] = json.loads(json.dumps(data["divergence"]))  # tuples as JSON lists
        return data

    def to_json(self, **kwargs) -> str:
        """The world as a JSON document."""
        return json.dumps(self.to_dict(), **kwargs)

    @classmethod
    def from_dict(cls, data: dict) -> WorldResult:
        """Inverse of :meth:`to_dict`."""
        known = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in known}
        kwargs["outcome"] = Outcome(kwargs["outcome"])
        kwargs["ranks"] = [RankResult.from_dict(r) for r in kwargs["ranks"]]
        kwargs["fired"] = [FiredFault(**f) for f in kwargs.get("fired", [])]
        kwargs["unfired"] = [
            UnfiredFault(f["index"], f["fault"], tuple(f.get("finished", ()))) for f in kwargs.get("unfired", [])
        ]
        kwargs["divergence"] = Divergence.from_dict(kwargs["divergence"]) if kwargs.get("divergence") else None
        return cls(**kwargs)

    def report(self, *, output_lines: int = 15) -> str:
        """The human-readable report: verdict, per-rank table, root cause, stacks, output tails."""
        return render_world(self, output_lines=output_lines)

    def __str__(self) -> str:
        return self.report()


def describe_function(fn) -> str:
    """``path/to/file.py:name`` (or ``module:name``) for reports and replay commands."""
    module = sys.modules.get(getattr(fn, "__module__", ""), None)
    path = getattr(module, "__file__", None)
    name = getattr(fn, "__qualname__", repr(fn))
    if path:
        rel = os.path.relpath(path)
        return f"{path if rel.startswith('..') else rel}:{name}"
    return f"{getattr(fn, '__module__', '?')}:{name}"


# -- the human-readable rendering -------------------------------------------------------------

_GLOO_PREFIX = re.compile(r"\[[^\]]*/gloo/[^\]]*\] ")


def _cell(text, width: int) -> str:
    text = _GLOO_PREFIX.sub("", "" if text is None else str(text))
    return text if len(text) <= width else text[: width - 1] + "…"


def rank_table(ranks: list[RankResult]) -> str:
    """One line per rank: outcome, state, last step, where it stood, its error."""
    header = f"{'rank':>4}  {'outcome':<9}  {'state':<8}  {'step':>4}  {'where':<58}  error"
    lines = [header, "-" * len(header)]
    for r in ranks:
        error = r.error
        if error and r.collateral:
            error = f"(collateral) {error}"
        step = "-" if r.last_step is None else r.last_step
        lines.append(
            f"{r.rank:>4}  {str(r.outcome):<9}  {str(r.state):<8}  {step:>4}  {_cell(r.where or r.site, 58):<58}  "
            f"{_cell(error, 110)}"
        )
    return "\n".join(lines)


def replay_line(world: WorldResult) -> str:
    """The one-line command that reruns this world with the same seed and faults."""
    if world.replay:
        return world.replay
    faults = f" --faults {shlex.quote('[' + ', '.join(world.faults) + ']')}" if world.faults else ""
    faults += f" --kwargs {shlex.quote(world.kwargs)}" if world.kwargs else ""
    return (
        f"python -m ddpfaults run {shlex.quote(world.function)} --world-size {world.world_size} "
        f"--seed {world.seed} --timeout {world.timeout:g} --stall {world.stall:g} "
        f"{startup_option(world.startup)}--peer-failure {world.peer_failure}{faults}"
    )


def startup_option(startup: float | None) -> str:
    """``--startup S `` for a replay line, when the start-up limit was not the default."""
    return f"--startup {startup:g} " if startup is not None else ""


def _grouped_stacks(ranks: list[RankResult]) -> list[tuple[list[int], str, str]]:
    """Stacks of ranks that did not finish (for ranks that raised: taken when a peer's failure was first seen),
    identical ones (thread ids aside) shown once for all."""
    groups: dict = {}
    for r in ranks:
        if r.stack and r.state in (RankState.BLOCKED, RankState.RUNNING, RankState.DIED, RankState.RAISED):
            body = "\n".join(line for line in r.stack.splitlines() if "thread 0x" not in line.lower())
            groups.setdefault((str(r.state), body), []).append(r.rank)
    return [(members, state, body) for (state, body), members in groups.items()]


def report_parts(world: WorldResult, *, output_lines: int = 15) -> tuple[str, list[tuple[str, str]]]:
    """The report as data: its first screen (verdict, root cause, first divergence, per-rank table, faults,
    replay) and its sections ``(title, text)``: stacks, root tracebacks, output tails."""
    out = [
        f"ddpfaults: {world.world_size}-rank {world.backend} world {str(world.outcome).upper()} "
        f"in {world.elapsed:.2f} s ({world.reason})",
        f"function: {world.function}   seed: {world.seed}   peer_failure: {world.peer_failure}"
        + (f"   steps counted by: {world.step_clock}" if world.step_clock != "ctx.step" else ""),
        f"root cause: {world.root_cause}",
    ]
    if world.divergence:
        out.append(f"first divergent {world.divergence.describe()}")
    out += ["", rank_table(world.ranks), ""]
    if world.faults:
        out.append("faults: " + ", ".join(world.faults))
        out += [f"  - {fired.describe()}" for fired in world.fired] or ["  - (none fired)"]
        out += [f"  - {unfired.describe()}" for unfired in world.unfired]
    if world.outcome != "completed":
        out.append(f"replay: {replay_line(world)}")
    sections = [
        (f"{format_ranks(ranks)} stack ({'when a failure was first seen' if state == 'raised' else state})", stack)
        for ranks, state, stack in _grouped_stacks(world.ranks)
    ]
    sections += [
        (f"rank {r.rank} traceback", r.traceback.rstrip()) for r in world.ranks if r.traceback and not r.collateral
    ]
    for r in world.ranks:
        tail = r.output.splitlines()[-output_lines:] if output_lines else []
        if tail and (r.state != RankState.FINISHED or world.outcome != "completed"):
            sections.append((f"rank {r.rank} output (last {len(tail)} lines)", "\n".join(tail)))
    return "\n".join(out).rstrip("\n"), sections


def render_world(world: WorldResult, *, output_lines: int = 15) -> str:
    """Verdict, root cause, first divergence, per-rank table, faults, replay, then stacks and outputs."""
    head, sections = report_parts(world, output_lines=output_lines)
    return "\n".join([head, *(f"\n--- {title} ---\n{text}" for title, text in sections)])
