"""One engine entry: a local world's request, built and validated once at its door (``run_world``, ``run_script``,
the command line, the pytest plugin, a scenario case) and passed whole, and :func:`run`, which owns its attempt loop
(restarts, the resume check's second run, the hand-off to the reports and the unfired-fault check).

What the ranks run is the request's ``target``: a rank function's (:class:`ddpfaults.engine.launcher.FunctionTarget`)
or a script's (:class:`ddpfaults.engine.scripts.ScriptRun`); each knows what outlives its attempts (``kept``) and
how to run one attempt (``attempt``). Light: imports no torch (the pool, which does, when a request is checked)."""

from __future__ import annotations

import dataclasses
from contextlib import AbstractContextManager
from typing import Any, ClassVar, Protocol

from ddpfaults import errors
from ddpfaults.engine import capacity, restarts
from ddpfaults.engine.folders import check_output_dir
from ddpfaults.faults import Plan, check_faults
from ddpfaults.judge.results import WorldResult
from ddpfaults.proc import platform
from ddpfaults.spec import RunSpec, settings_given


class Target(Protocol):
    """What a world's ranks run, as the attempt loop sees it: the public call it stands for (``call``), the settings
    that call takes (``settings``; None: every one) and those it always runs with (``fixed``)."""

    call: ClassVar[str]
    settings: ClassVar[tuple | None]
    fixed: ClassVar[dict]

    def kept(self, spec: RunSpec) -> AbstractContextManager[Any]:
        """What one run (all its attempts) shares: a directory kept across restarts, or nothing."""

    def attempt(self, request: WorldRequest, plan: Plan, attempt: int, resume_watch: frozenset, kept) -> WorldResult:
        """Run attempt ``attempt`` of ``plan`` and judge it."""


@dataclasses.dataclass(frozen=True)
class WorldRequest:
    """One local world, as every door (the public calls, the command line, the pytest plugin, a scenario case)
    builds it and passes it whole: what its ranks run, its fault plan (checked against the spec), its run spec
    (local, checked), where its flight records go (None: nowhere) and whether a fault that never fired is an error.
    A new field of a world's request is a field here (a new setting: one of the settings table's,
    :class:`~ddpfaults.spec.RunSpec`)."""

    target: Target
    plan: Plan
    spec: RunSpec
    flight_recorder_dir: str | None = None
    require_faults_fire: bool = True

    @classmethod
    def of(
        cls,
        target: Target,
        faults=(),
        spec: RunSpec | None = None,
        flight_recorder_dir=None,
        require_faults_fire=True,
        **settings,
    ) -> WorldRequest:
        """The request, once the settings (``spec``, None: the defaults, with ``settings``, keywords naming its
        fields that the target's call takes, over it; the environment's ``DDPFAULTS_*`` for those not given:
        :meth:`RunSpec.of <ddpfaults.spec.RunSpec.of>`) fit a world on this machine, ``faults`` are a valid plan
        for it (each fault's attempt one the world can reach) and ``flight_recorder_dir`` a folder the dumps can be
        written in: the errors of bad input, before any rank starts. A ``world_size`` given is required to be one
        (None is refused as any other bad value)."""
        from ddpfaults.engine import pool  # imports torch: a door validates its input first

        sized = "world_size" in settings
        world_size = settings.pop("world_size", None)
        given = settings_given(target.call, settings, target.settings)
        spec = RunSpec.of(spec, **given, **target.fixed)
        spec = local_spec(dataclasses.replace(spec, world_size=world_size) if sized else spec)
        plan = check_faults(faults, spec.world_size)
        restarts.check_attempts(plan, spec.max_restarts)
        check_output_dir(flight_recorder_dir, "flight_recorder_dir")
        if spec.reuse and pool.pooled(pool.world_key(spec)) and not plan.data_only:
            capacity.check_world_size(spec.world_size)  # a world of its own beside the pooled one
        return cls(target, plan, spec, flight_recorder_dir, require_faults_fire)


def local_spec(spec: RunSpec) -> RunSpec:
    """``spec``, validated for a world on this machine (Linux, gloo, the ranks it can hold)."""
    from ddpfaults.engine import pool

    platform.require("local worlds (run_world, run_script, the matrix, the pytest plugin)")
    if spec.backend != "gloo":
        raise errors.UnknownBackend(f"backend {spec.backend!r} cannot run in a local world here; use 'gloo'")
    if not (spec.reuse and pool.pooled(pool.world_key(spec))):  # a pooled world is already held
        capacity.check_world_size(spec.world_size)
    return spec


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
