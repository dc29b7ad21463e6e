"""Human-readable rendering of a world result (plain text, one screen first, details after)."""

from __future__ import annotations

import re

from .results import RankResult, RankState, WorldResult
from .verdict import format_ranks


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
    faults = f" --faults {_shell_quote('[' + ', '.join(world.faults) + ']')}" if world.faults else ""
    faults += f" --kwargs {_shell_quote(world.kwargs)}" if world.kwargs else ""
    return (
        f"python -m ddpfaults run {_shell_quote(world.function)} --world-size {world.world_size} "
        f"--seed {world.seed} --timeout {world.timeout:g} --stall {world.stall:g} "
        f"--peer-failure {world.peer_failure}{faults}"
    )


def _shell_quote(text: str) -> str:
    import shlex

    return shlex.quote(text)


def _grouped_stacks(ranks: list[RankResult]) -> list[tuple[list[int], str, str]]:
    """Stacks of blocked/running/died ranks, identical ones (thread ids aside) shown once for all."""
    groups: dict = {}
    for r in ranks:
        if r.stack and r.state in (RankState.BLOCKED, RankState.RUNNING, RankState.DIED):
            body = "\n".join(line for line in r.stack.splitlines() if "thread 0x" not in line.lower())
            groups.setdefault((str(r.state), body), []).append(r.rank)
    return [(members, state, body) for (state, body), members in groups.items()]


def render_world(world: WorldResult, *, output_lines: int = 15) -> str:
    """Verdict, root cause, first divergence, per-rank table, faults, replay, then stacks and outputs."""
    out = [
        f"ddpfaults: {world.world_size}-rank {world.backend} world {str(world.outcome).upper()} "
        f"in {world.elapsed:.2f} s ({world.reason})",
        f"function: {world.function}   seed: {world.seed}   peer_failure: {world.peer_failure}",
        f"root cause: {world.root_cause}",
    ]
    if world.divergence:
        out.append(f"first divergent {world.divergence}")
    out += ["", rank_table(world.ranks), ""]
    if world.faults:
        out.append("faults: " + ", ".join(world.faults))
        for fired in world.fired or ["(none fired)"]:
            out.append(f"  - {fired}")
    if world.outcome != "completed":
        out.append(f"replay: {replay_line(world)}")
    for ranks, state, stack in _grouped_stacks(world.ranks):
        out += ["", f"--- {format_ranks(ranks)} stack ({state}) ---", stack]
    for r in world.ranks:
        if r.traceback and not r.collateral:
            out += ["", f"--- rank {r.rank} traceback ---", r.traceback.rstrip()]
    for r in world.ranks:
        tail = r.output.splitlines()[-output_lines:] if output_lines else []
        if tail and (r.state != RankState.FINISHED or world.outcome != "completed"):
            out += ["", f"--- rank {r.rank} output (last {len(tail)} lines) ---", *tail]
    return "\n".join(out)
