"""Restarts under ``torchrun --max-restarts N``: torchrun's agent restarts the world, ddpfaults follows it.

Every attempt is a torchrun round of its own (its keys under ``ddpfaults/<run id>/<restart>``, its own process
group store, below). Its judge publishes the verdict ``4`` (:data:`RESTART`) when the attempt crashed, hung or was
preempted and torchrun has restarts left: every worker then exits :data:`EXIT_RESTART` (non-zero), and torchrun
restarts the world. The attempt's judged world is kept in torchrun's agent store, which outlives the workers, under
``ddpfaults/<run id>/attempt/<k>``; the last attempt's judge reads them back and merges them into its result as the
local launcher does (:func:`ddpfaults.engine.restarts.merge`): ``attempts``, and ``fired``/``unfired`` over every
attempt. Only that last verdict is compared with the case's ``Expect`` (exit 0 or 1); it is also recorded
(``ddpfaults/<run id>/final``), so that a world torchrun restarts after it (a mismatch exits 1, and torchrun
restarts on any failed worker) ends at once with the same exit code instead of running the case again.
"""

from __future__ import annotations

import dataclasses
import json

from ddpfaults.engine import restarts
from ddpfaults.errors import ConfigError, FaultError
from ddpfaults.judge.results import Outcome, WorldResult

RESTART = 4  # the verdict key's value for "this attempt ends in a restart"
EXIT_RESTART = 3  # a worker's exit code then: non-zero, so that torchrun restarts the world


def check_restarts(case, spec, faults, env, local_command: str):
    """``spec`` with torchrun's ``max_restarts``; a :class:`~ddpfaults.errors.DDPFaultsError` for what torchrun
    cannot run: a case declaring other restarts than torchrun's ``--max-restarts``, the resume check, restarts
    without torchrun's agent store, a fault of an attempt torchrun never starts."""
    declared = case.settings.get("max_restarts")
    if declared is not None and declared != env.max_restarts:
        raise ConfigError(
            f"the case declares max_restarts={declared}, but torchrun was started with --max-restarts "
            f"{env.max_restarts}: start torchrun with --max-restarts {declared} (torchrun restarts the world, "
            f"and the case's expectation counts on {declared} restart(s))"
        )
    if spec.check_resume:
        raise ConfigError(
            f"the case asks for the resume check (check_resume, or an Expect naming a resume finding), which "
            f"compares the restarted run with an uninterrupted one that torchrun cannot start beside it: run it "
            f"with ddpfaults' own launcher instead: {local_command}"
        )
    if env.max_restarts and not env.agent_store:
        raise ConfigError(
            f"torchrun --max-restarts {env.max_restarts} needs torchrun's agent store, which keeps the attempts' "
            f"results across restarts: unset TORCH_DISABLE_SHARE_RDZV_TCP_STORE"
        )
    try:
        restarts.check_attempts(faults, env.max_restarts)
    except FaultError as exc:
        raise FaultError(f"{exc} (here max_restarts is torchrun's --max-restarts)") from None
    return spec.replace(max_restarts=env.max_restarts)


def config_error_text(exc: Exception, restart: str) -> str:
    """Rank 0's line for a configuration error: the whole error in attempt 0; in a restart (``restart``:
    ``TORCHELASTIC_RESTART_COUNT``; torchrun restarts on any failed worker, so every attempt meets the same error)
    only that it was met again."""
    if restart in ("", "0"):
        return f"ddpfaults: error: {type(exc).__name__}: {exc}"
    return f"ddpfaults: error: attempt {restart} stopped on the configuration error again ({type(exc).__name__}: above)"


def final_verdict(run_store) -> int | None:
    """The exit code of the world's last attempt, if one already reached its verdict (None: none did)."""
    return int(run_store.get("final")) if run_store.check(["final"]) else None


def ended_before(run_store, env) -> int | None:
    """The exit code of the world if its verdict came before this attempt (torchrun restarts on any failed worker,
    a mismatch's exit 1 too; rank 0 says so), else None: this attempt runs."""
    final = final_verdict(run_store)
    if final is not None and env.rank == 0:
        print(
            f"ddpfaults: the world's verdict came before attempt {env.restart} (exit {final}); torchrun restarts on "
            "any failed worker: not run again",
            flush=True,
        )
    return final


def no_restart_follows(run_store, env) -> bool:
    """True if no attempt follows this one (its files can go): the last one, or the world's verdict reached."""
    try:
        return env.restart >= env.max_restarts or final_verdict(run_store) is not None
    except Exception:  # noqa: BLE001 - the store gone: so is torchrun's agent, no restart follows
        return True


def conclude(run_store, result: WorldResult, env, faults) -> WorldResult | None:
    """None if this attempt ends in a restart (its result kept in the store for the last attempt); else the world's
    result: with ``--max-restarts``, this attempt's merged with every earlier one's."""
    if env.max_restarts == 0:
        return result
    if env.restart < env.max_restarts and restarts.restarted(result):
        kept = dataclasses.replace(result, unfired=restarts.own_unfired(result, faults, env.restart))
        run_store.set(f"attempt/{env.restart}", kept.to_json())
        return None
    earlier = [_earlier(run_store, k) for k in range(env.restart)]
    return restarts.merge([*earlier, result], faults)


def record_final(run_store, code: int) -> None:
    """Record the world's exit code (see the module)."""
    run_store.set("final", str(code))


NO_VERDICT = "no verdict in torchrun's store"  # the reason of an attempt that left none (:func:`no_verdict`)


def no_verdict(attempt: int) -> WorldResult:
    """What the last attempt knows of attempt ``attempt`` when it left no verdict in torchrun's store (no rank lived
    to judge it: every rank was killed at once, or its judge failed): crashed, since torchrun restarts a world only
    when a worker failed; no root cause nor rank; its steps, seconds (None) and faults unknown (none fired, none
    unfired)."""
    why = f"no verdict: attempt {attempt} left none in torchrun's store; torchrun restarted it (its log says why)"
    return WorldResult(Outcome.CRASHED, [], why, None, NO_VERDICT, None)


def _earlier(run_store, attempt: int) -> WorldResult:
    """Attempt ``attempt``'s judged world as its judge kept it, else :func:`no_verdict`."""
    if run_store.check([f"attempt/{attempt}"]):
        return WorldResult.from_dict(json.loads(run_store.get(f"attempt/{attempt}")))
    return no_verdict(attempt)
