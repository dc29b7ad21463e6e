"""One engine entry: a local world's request, built and validated once by ``run_world`` or ``run_script`` and
passed whole, and :func:`run`, which owns its attempt loop (restarts, the resume check's second run, the hand-off
to the reports and the unfired-fault check).

What the ranks run is the request's ``target``: a rank function's (:class:`ddpfaults.engine.launcher.FunctionTarget`)
or a script's (:class:`ddpfaults.engine.scripts.ScriptRun`); each knows what outlives its attempts (``kept``) and
how to run one attempt (``attempt``). Light: imports no torch."""

from __future__ import annotations

import dataclasses
from contextlib import AbstractContextManager
from typing import Any, Protocol

from ddpfaults.engine import restarts
from ddpfaults.engine.folders import check_output_dir
from ddpfaults.faults import Plan, check_faults
from ddpfaults.judge.results import WorldResult
from ddpfaults.spec import RunSpec


class Target(Protocol):
    """What a world's ranks run, as the attempt loop sees it."""

    def kept(self, spec: RunSpec) -> AbstractContextManager[Any]:
        """What one run (all its attempts) shares: a directory kept across restarts, or nothing."""

    def attempt(self, request: WorldRequest, plan: Plan, attempt: int, resume_watch: frozenset, kept) -> WorldResult:
        """Run attempt ``attempt`` of ``plan`` and judge it."""


@dataclasses.dataclass(frozen=True)
class WorldRequest:
    """One local world: what its ranks run, its fault plan (checked against the spec), its run spec (local, checked),
    where its flight records go (None: nowhere) and whether a fault that never fired is an error."""

    target: Target
    plan: Plan
    spec: RunSpec
    flight_recorder_dir: str | None = None
    require_faults_fire: bool = True

    @classmethod
    def of(cls, target: Target, faults, spec: RunSpec, flight_recorder_dir=None, require_faults_fire=True):
        """The request, once ``faults`` are a valid plan for ``spec`` (each fault's attempt one the world can reach)
        and ``flight_recorder_dir`` a folder the dumps can be written in: the errors of bad input, before any rank
        starts."""
        plan = check_faults(faults, spec.world_size)
        restarts.check_attempts(plan, spec.max_restarts)
        check_output_dir(flight_recorder_dir, "flight_recorder_dir")
        return cls(target, plan, spec, flight_recorder_dir, require_faults_fire)


def run(request: WorldRequest) -> WorldResult:
    """Run the world of ``request``: its attempts (restarted while it crashes or hangs, up to ``max_restarts``), the
    resume check's run without faults when the spec asks, the result handed to the reports."""
    spec, target = request.spec, request.target

    def run_plan(plan: Plan, resume_watch: frozenset = frozenset()) -> WorldResult:
        with target.kept(spec) as kept:
            return restarts.run_attempts(
                lambda attempt: target.attempt(request, plan, attempt, resume_watch, kept), plan, spec.max_restarts
            )

    return restarts.finished_world(run_plan, request.plan, spec, request.require_faults_fire)
