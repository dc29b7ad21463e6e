"""Results are data: plain, serialisable objects describing a world and each of its ranks."""

from __future__ import annotations

import enum
import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any


class Outcome(str, enum.Enum):
    """The verdict of a world or a rank. Its values are the strings users write in ``expect=``."""

    COMPLETED = "completed"
    HUNG = "hung"
    CRASHED = "crashed"

    def __str__(self) -> str:
        return self.value


class RankState(str, enum.Enum):
    """How a rank stood when the world was judged (finer than its outcome)."""

    FINISHED = "finished"  # fn returned; the rank waited, process group open, for the verdict
    RAISED = "raised"  # fn raised; the rank reported its error (then exited or lingered)
    DIED = "died"  # the process ended without reporting (signal, os._exit, crash in C++)
    BLOCKED = "blocked"  # alive, waiting on its peers (collective, DDP reduction, barrier, store)
    RUNNING = "running"  # alive, outside any collective (computing, sleeping) when the timeout hit

    def __str__(self) -> str:
        return self.value


_STATE_OUTCOME = {
    RankState.FINISHED: Outcome.COMPLETED,
    RankState.RAISED: Outcome.CRASHED,
    RankState.DIED: Outcome.CRASHED,
    RankState.BLOCKED: Outcome.HUNG,
    RankState.RUNNING: Outcome.HUNG,
}


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

    def describe(self) -> str:
        """``all_reduce([1]) at criterion.py:42 in loss (step 3)``."""
        shapes = ", ".join(str(s) for s in self.shapes)
        note = f" [{self.note}]" if self.note else ""
        step = f" (step {self.step})" if self.step is not None else ""
        return f"{self.op}({shapes}){note} at {self.site}{step}"

    def signature(self) -> tuple:
        """What must agree across ranks for the call to match."""
        return (self.op, json.dumps(self.shapes), self.note, self.site, self.step)


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
    fired: list[str] = field(default_factory=list)
    output: str = ""  # the captured stdout+stderr (tail)
    events: list[dict] = field(default_factory=list)  # timeline, t in seconds since world start

    @property
    def outcome(self) -> Outcome:
        """completed / hung / crashed for this rank."""
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
    def from_dict(cls, data: dict) -> "RankResult":
        """Inverse of :meth:`to_dict` (values that were repr'd stay strings)."""
        known = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in known}
        kwargs["state"] = RankState(kwargs["state"])
        kwargs["collectives"] = [Collective(**c) for c in kwargs.get("collectives", [])]
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
    divergence: str | None = None
    faults: list[str] = field(default_factory=list)
    fired: list[str] = field(default_factory=list)
    function: str = ""
    kwargs: str = ""  # repr of the keyword arguments the function got (for the replay line)
    replay: str | None = None
    events: list[dict] = field(default_factory=list)  # launcher-side: stall began, verdict (t since start)
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
        return data

    def to_json(self, **kwargs) -> str:
        """The world as a JSON document."""
        return json.dumps(self.to_dict(), **kwargs)

    @classmethod
    def from_dict(cls, data: dict) -> "WorldResult":
        """Inverse of :meth:`to_dict`."""
        known = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in known}
        kwargs["outcome"] = Outcome(kwargs["outcome"])
        kwargs["ranks"] = [RankResult.from_dict(r) for r in kwargs["ranks"]]
        return cls(**kwargs)

    def report(self, *, output_lines: int = 15) -> str:
        """The human-readable report: verdict, per-rank table, root cause, stacks, output tails."""
        from .report import render_world

        return render_world(self, output_lines=output_lines)

    def __str__(self) -> str:
        return self.report()
