"""Results are data: plain, serialisable objects describing a world and each of its ranks (their text is
:mod:`ddpfaults.report.text`'s)."""

from __future__ import annotations

import enum
import json
from dataclasses import InitVar, asdict, dataclass, field, fields
from typing import Any

from ddpfaults.errors import ConfigError
from ddpfaults.events import SITELESS_MAKERS
from ddpfaults.judge.ranks import format_ranks
from ddpfaults.spec import RunSpec


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


class Busy(str, enum.Enum):
    """What kept a live rank busy when a deadline stopped its world (:attr:`RankResult.busy`): slow, not stuck, so
    the world timed out with no culprit."""

    STARTING = "starting"  # never joined the process group; still importing, computing or not yet answering
    COMPUTING = "computing"  # its main thread runnable, or running in the last quiet spell, when the timeout came

    def __str__(self) -> str:
        return self.value

    @classmethod
    def of(cls, starting: bool, computing: bool) -> Busy | None:
        """A rank's ``busy`` from what the judge found: starting if it never joined the process group (whether or not
        it computed), else computing, else None (idle)."""
        return cls.STARTING if starting else cls.COMPUTING if computing else None


_STATE_OUTCOME = {
    RankState.FINISHED: Outcome.COMPLETED,
    RankState.RAISED: Outcome.CRASHED,
    RankState.DIED: Outcome.CRASHED,
    RankState.BLOCKED: Outcome.HUNG,
    RankState.RUNNING: Outcome.HUNG,
}


#: a divergence's ``basis`` when no evidence shows which ranks diverged, and none says why
NOTHING_SHOWS = "nothing shows which diverged"

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
    group: str | None = None  # the process group's identity when not the default group (events.group_key)
    members: list | None = None  # that group's member ranks (None: the default group, every rank)

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
    file: str | None = None  # the file it cut on disk (a checkpoint fault's, resolved), if it did

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
    hint: str = ""  # why it may not have fired, when the fault can tell (the collectives its step had...)

    @property
    def had_chance(self) -> bool:
        """True if a rank it targets finished its function without it taking effect."""
        return bool(self.finished)

    def describe(self) -> str:
        """``EmptyBatch(rank=1, step=9) never fired, though rank 1 finished its function``."""
        hint = f": {self.hint}" if self.hint else ""
        if self.had_chance:
            return (
                f"{self.fault} never fired, though {format_ranks(self.finished)} finished without it taking effect"
                + hint
            )
        return f"{self.fault} never fired (no rank it targets finished its function: they raised, died or stalled)"


@dataclass(frozen=True)
class Desync:
    """Collectives the ranks paired across different steps: matching in everything but their step (a same-size
    all_reduce of rank 0's step 3 met rank 1's step 4), silently, as gloo checks sizes and not steps. ``index``:
    the first such collective's number; ``first_step``: its step on the lowest rank; ``steps``: how many of that
    rank's steps had a collective paired with another step's; ``at``: each rank's step at the first, as
    ``[rank, step]`` pairs; ``call``: what the lowest rank called there (without its step)."""

    index: int
    first_step: int
    steps: int
    at: tuple
    call: str

    def describe(self) -> str:
        """``collectives paired across steps from step 3: collective #9, all_reduce([36]) [DDP gradient bucket], was
        step 3 on rank 0, step 4 on rank 1; 27 steps ran paired wrong``."""
        where = ", ".join(f"step {step} on rank {rank}" for rank, step in self.at)
        plural = "s" if self.steps != 1 else ""
        return (
            f"collectives paired across steps from step {self.first_step}: collective #{self.index}, {self.call}, "
            f"was {where}; {self.steps} step{plural} ran paired wrong"
        )

    @classmethod
    def from_dict(cls, data: dict) -> Desync:
        """Inverse of ``dataclasses.asdict``."""
        return cls(**{**data, "at": tuple(tuple(pair) for pair in data["at"])})


#: the kinds of :class:`Cause`: every rank failing alike on its own, the scheduler preempting the job, a file one
#: rank wrote torn that every rank then failed to read
CAUSE_KINDS = ("common_error", "preemption", "outside_signal", "torn_file")


@dataclass(frozen=True)
class Cause:
    """What ended a world when it is no divergence of one rank's collectives, as data (ddpfaults.judge.causes):
    its ``kind`` (one of :data:`CAUSE_KINDS`), the rank at fault (``culprit``, None when none is), the ranks it
    concerns and its facts: the exception every rank raised and where (``error``, ``site``, ``step``), the fault
    that acted (``fault``, its repr, and ``how``, what it did; for a common error, how the ranks' messages
    differ); for a common error, ``unreached``: the ranks that failed as a consequence of the others' exits before
    they joined the process group, so never got as far as the error."""

    kind: str
    culprit: int | None = None
    ranks: tuple = ()
    error: str = ""
    site: str = ""
    step: int | None = None
    fault: str = ""
    how: str = ""
    unreached: tuple = ()

    def describe(self) -> str:
        """The root cause in one sentence."""
        step = f" at step {self.step}" if self.step is not None else ""
        if self.kind == "common_error":
            site = f" at {self.site}" if self.site else ""
            note = f" ({self.how})" if self.how else ""
            who, short = "every rank", ""
            if self.unreached:
                who = format_ranks(self.ranks)
                short = (
                    f"; {format_ranks(self.unreached)} failed as a consequence, connecting to them as they exited, "
                    f"before {'it' if len(self.unreached) == 1 else 'they'} joined the process group"
                )
            return (
                f"{who} raised {self.error}{site}{step}, each on its own{note}{short}: a common cause (the code or "
                f"the environment), no rank at fault"
            )
        if self.kind == "outside_signal":
            return (
                f"{format_ranks(self.ranks)} {'was' if len(self.ranks) == 1 else 'were'} ended by {self.error} from "
                f"outside the world (no fault of the plan sent it: a scheduler or an operator stopped the job)"
                f"{self.how}; no rank at fault"
            )
        if self.kind == "preemption":
            return (
                f"the job was preempted{step}: {self.fault} sent the notice to every rank and {self.how}; no rank "
                f"at fault"
            )
        return f"rank {self.culprit} wrote a torn file{step} ({self.fault}: {self.how}); {self.error}"

    @classmethod
    def from_dict(cls, data: dict) -> Cause:
        """Inverse of ``dataclasses.asdict``."""
        return cls(**{**data, "ranks": tuple(data.get("ranks", ())), "unreached": tuple(data.get("unreached", ()))})


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
            why = f" ({self.basis})" if self.basis and self.basis != NOTHING_SHOWS else ""
            return (
                f"{format_ranks(everyone)} disagree at collective #{self.index} and nothing shows which diverged"
                + f"{why}: "
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
    busy: Busy | None = None  # what kept it busy when a deadline stopped the world (starting, computing); None: idle
    wrapped: list[dict] = field(default_factory=list)  # the modules it wrapped in DDP/FSDP, their state's digest

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
        data["busy"] = None if self.busy is None else str(self.busy)
        data["outcome"] = str(self.outcome)
        try:
            json.dumps(self.value)
        except (TypeError, ValueError):
            data["value"] = repr(self.value)
        return data

    @classmethod
    def from_dict(cls, data: dict) -> RankResult:
        """Inverse of :meth:`to_dict` (values that were repr'd stay strings). A document of version 3 or before gives
        ``busy`` as two flags, ``starting`` and ``computing``: read as ``busy`` (starting first)."""
        known = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in known}
        kwargs["state"] = RankState(kwargs["state"])
        busy = data["busy"] if "busy" in data else Busy.of(bool(data.get("starting")), bool(data.get("computing")))
        kwargs["busy"] = None if busy is None else Busy(busy)
        kwargs["collectives"] = [Collective(**c) for c in kwargs.get("collectives", [])]
        kwargs["fired"] = [FiredFault(**f) for f in kwargs.get("fired", [])]
        return cls(**kwargs)


#: the run settings a report document gives as fields of the world, flat, in its order (``startup`` only when not
#: the default); a :class:`WorldResult` takes them as keywords too, and reads them from its ``spec``
SPEC_FIELDS = (
    "world_size",
    "seed",
    "backend",
    "peer_failure",
    "start_method",
    "stall",
    "timeout",
    "startup",
    "cuda_on_cpu",
)


@dataclass(frozen=True)
class WorldResult:
    """What a world did: its verdict, why, and every rank's result in rank order; ``spec`` is the run spec it ran
    with (:data:`SPEC_FIELDS` given instead make it), ``launcher`` who started its ranks (``"torchrun"``: torchrun's
    agent, whatever the spec's ``start_method``).

    Frozen: a result others hold never changes. Whoever knows more after the verdict (the engine's pool, the
    attempts merged, the resume check, the replay line) makes a new one with ``dataclasses.replace``."""

    outcome: Outcome
    ranks: list[RankResult]
    root_cause: str
    root_rank: int | None
    reason: str  # how the verdict was reached
    elapsed: float
    world_size: InitVar[int | None] = None
    seed: InitVar[int | None] = None
    backend: InitVar[str | None] = None
    peer_failure: InitVar[str | None] = None
    start_method: InitVar[str | None] = None
    stall: InitVar[float | None] = None
    timeout: InitVar[float | None] = None
    startup: InitVar[float | None] = None
    cuda_on_cpu: InitVar[bool | None] = None
    spec: RunSpec | None = None
    launcher: str = "local"
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
    attempts: list[dict] = field(default_factory=list)  # a restarted world's attempts (ddpfaults.engine.restarts)
    resume: dict | None = None  # the resume check's finding (ddpfaults.judge.checks.resume)
    preemption: dict | None = None  # what a Preempt did (ddpfaults.judge.checks.recovery)
    cause: Cause | None = None  # what ended the world when no rank's divergence did (ddpfaults.judge.causes)
    desync: Desync | None = None  # collectives paired across different steps (ddpfaults.judge.desync)
    # the resume check's records, kept out of the document: an attempt's per rank (ddpfaults.judge.checks.resume.read),
    # a restarted world's one such list per attempt (ddpfaults.engine.restarts)
    resume_records: list | None = field(default=None, repr=False, compare=False)

    def __post_init__(self, *given):
        values = dict(zip(SPEC_FIELDS, given, strict=True))
        if values["start_method"] == "torchrun":
            object.__setattr__(self, "launcher", "torchrun")  # frozen: the dataclass's own way to set a field
            values["start_method"] = None
        if self.spec is None:
            object.__setattr__(self, "spec", _spec_of(values))
            return
        # dataclasses.replace passes the settings on as this result reads them from its spec: only another value is
        # a second answer
        differing = [f"{k}={v!r}" for k, v in values.items() if v is not None and v != getattr(self, k)]
        if differing:
            raise TypeError(
                f"WorldResult: give the run settings as spec=, or as fields, not both ({', '.join(differing)} given "
                f"with a spec that says otherwise)"
            )

    @property
    def values(self) -> list:
        """Each rank's return value, in rank order."""
        return [r.value for r in self.ranks]

    def to_dict(self) -> dict:
        """A JSON-ready dict of the whole world (its spec's settings as fields of it, :data:`SPEC_FIELDS`)."""
        data = asdict(self)
        flat = {name: getattr(self, name) for name in SPEC_FIELDS}
        del data["spec"], data["launcher"], data["resume_records"]
        head = list(data)[:6]  # outcome ... elapsed, then the settings, as the document has always had them
        data = {**{k: data[k] for k in head}, **flat, **{k: v for k, v in data.items() if k not in head}}
        data["outcome"] = str(self.outcome)
        data["ranks"] = [r.to_dict() for r in self.ranks]
        for name in ("divergence", "cause", "desync"):
            data[name] = json.loads(json.dumps(data[name]))  # tuples as JSON lists
        return data

    def to_json(self, **kwargs) -> str:
        """The world as a JSON document."""
        return json.dumps(self.to_dict(), **kwargs)

    @classmethod
    def from_dict(cls, data: dict) -> WorldResult:
        """Inverse of :meth:`to_dict`."""
        known = {f.name for f in fields(cls)} | set(SPEC_FIELDS)
        kwargs = {k: v for k, v in data.items() if k in known}
        kwargs["outcome"] = Outcome(kwargs["outcome"])
        kwargs["ranks"] = [RankResult.from_dict(r) for r in kwargs["ranks"]]
        kwargs["fired"] = [FiredFault(**f) for f in kwargs.get("fired", [])]
        kwargs["unfired"] = [
            UnfiredFault(f["index"], f["fault"], tuple(f.get("finished", ())), f.get("hint", ""))
            for f in kwargs.get("unfired", [])
        ]
        kwargs["divergence"] = Divergence.from_dict(kwargs["divergence"]) if kwargs.get("divergence") else None
        kwargs["cause"] = Cause.from_dict(kwargs["cause"]) if kwargs.get("cause") else None
        kwargs["desync"] = Desync.from_dict(kwargs["desync"]) if kwargs.get("desync") else None
        return cls(**kwargs)

    def report(self, *, output_lines: int = 15) -> str:
        """The human-readable report: verdict, per-rank table, root cause, stacks, output tails
        (:func:`~ddpfaults.report.text.render_world`; imported here: the verdict's data does not depend on its text)."""
        from ddpfaults.report.text import render_world

        return render_world(self, output_lines=output_lines)

    def __str__(self) -> str:
        return self.report()


def _world_setting(name: str):
    def read(world: WorldResult):
        if name == "start_method" and world.launcher == "torchrun":
            return "torchrun"
        return world.spec.custom_startup if name == "startup" else getattr(world.spec, name)

    read.__doc__ = f"The spec's ``{name}``, as the report document gives it."
    return property(read)


for _name in SPEC_FIELDS:  # the settings the document gives flat, read from the spec (after the dataclass is made)
    setattr(WorldResult, _name, _world_setting(_name))


def _spec_of(values: dict) -> RunSpec:
    """The run spec a world's flat settings make (None: the default); a document's value that no spec could hold
    (a stall of 0 written by hand) is left to the default."""
    values = {k: v for k, v in values.items() if v is not None}
    try:
        return RunSpec(**values)
    except (ConfigError, TypeError):
        valid = {k: v for k, v in values.items() if _valid(k, v)}
        try:
            return RunSpec(**valid)
        except ConfigError:  # valid alone, not together (a stall not below the timeout)
            return RunSpec(**{k: v for k, v in valid.items() if k not in ("stall", "timeout")})


def _valid(name: str, value) -> bool:
    try:
        RunSpec(**{name: value})
    except (ConfigError, TypeError):
        return False
    return True
