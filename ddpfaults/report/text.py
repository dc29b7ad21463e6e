"""A world's result as text: the report a terminal, a test failure and ``python -m ddpfaults run`` print.

It reads the result types of :mod:`ddpfaults.judge.results` (a :class:`~ddpfaults.judge.results.WorldResult` and its
ranks) by their fields and imports nothing of them: ``WorldResult.report()`` renders through this one, importing it
when called (the verdict's data does not depend on its text).
"""

from __future__ import annotations

import re

from ddpfaults.judge.checks.recovery import describe_preemption
from ddpfaults.judge.checks.resume import describe as describe_resume
from ddpfaults.judge.ranks import format_ranks
from ddpfaults.replay import world_command

_GLOO_PREFIX = re.compile(r"\[[^\]]*/gloo/[^\]]*\] ")


def _cell(text, width: int) -> str:
    text = _GLOO_PREFIX.sub("", "" if text is None else str(text))
    return text if len(text) <= width else text[: width - 1] + "…"


def rank_table(ranks: list) -> str:
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


def describe_attempt(a: dict) -> str:
    """One attempt of a restarted world in one line: its verdict, seconds, the steps its ranks reached, its cause
    (only its verdict and cause for an attempt whose seconds are not known: one that left no verdict)."""
    if a["seconds"] is None:
        return f"attempt {a['attempt']}: {a['outcome']}; {a['root_cause']}"
    steps = ", ".join("-" if s is None else str(s) for s in a["steps"])
    cause = "" if a["outcome"] == "completed" else f"; {a['root_cause']}"
    return f"attempt {a['attempt']}: {a['outcome']} in {a['seconds']:.2f} s, steps reached [{steps}]{cause}"


def attempt_lines(attempts: list) -> list[str]:
    """A restarted world's attempts, one after another (none: nothing)."""
    if not attempts:
        return []
    lines = [f"attempts: {len(attempts)} (the last one's verdict above)"]
    for a in attempts:
        lines.append(f"  {describe_attempt(a)}")
        lines += [f"    - {fired}" for fired in a["fired"]]
        if a.get("preemption"):
            lines.append(f"    - {describe_preemption(a['preemption'])}")
    return lines


def _grouped_stacks(ranks: list) -> list[tuple[list[int], str, str]]:
    """Stacks of ranks that did not finish (for ranks that raised: taken when a peer's failure was first seen),
    identical ones (thread ids aside) shown once for all."""
    groups: dict = {}
    for r in ranks:
        if r.stack and r.state in ("blocked", "running", "died", "raised"):
            body = "\n".join(line for line in r.stack.splitlines() if "thread 0x" not in line.lower())
            groups.setdefault((str(r.state), body), []).append(r.rank)
    return [(members, state, body) for (state, body), members in groups.items()]


def report_parts(world, *, output_lines: int = 15) -> tuple[str, list[tuple[str, str]]]:
    """The report as data: its first screen (verdict, root cause, first divergence, per-rank table, faults,
    replay) and its sections ``(title, text)``: stacks, root tracebacks, output tails."""
    out = [
        f"ddpfaults: {world.world_size}-rank {world.backend} world {str(world.outcome).upper()} "
        f"in {world.elapsed:.2f} s ({world.reason})",
        f"function: {world.function}   seed: {world.seed}   peer_failure: {world.peer_failure}"
        + (f"   steps counted by: {world.step_clock}" if world.step_clock != "ctx.step" else "")
        + ("   CUDA mapped to the CPU (cuda_on_cpu)" if world.spec.cuda_on_cpu else ""),
        f"root cause: {world.root_cause}",
    ]
    if world.divergence:
        out.append(f"first divergent {world.divergence.describe()}")
    if world.desync:
        out.append(world.desync.describe())
    if world.preemption:
        out.append(describe_preemption(world.preemption))
    if world.resume:
        out.append(describe_resume(world.resume))
    out += attempt_lines(world.attempts)
    out += ["", rank_table(world.ranks), ""]
    if world.faults:
        out.append("faults: " + ", ".join(world.faults))
        out += [f"  - {fired.describe()}" for fired in world.fired] or ["  - (none fired)"]
        out += [f"  - {unfired.describe()}" for unfired in world.unfired]
    if world.outcome != "completed" or (world.resume and not world.resume["equivalent"]):
        out.append(f"replay: {world_command(world)}")
    sections = [
        (f"{format_ranks(ranks)} stack ({'when a failure was first seen' if state == 'raised' else state})", stack)
        for ranks, state, stack in _grouped_stacks(world.ranks)
    ]
    sections += [
        (f"rank {r.rank} traceback", r.traceback.rstrip()) for r in world.ranks if r.traceback and not r.collateral
    ]
    for r in world.ranks:
        tail = r.output.splitlines()[-output_lines:] if output_lines else []
        if tail and (r.state != "finished" or world.outcome != "completed"):
            sections.append((f"rank {r.rank} output (last {len(tail)} lines)", "\n".join(tail)))
    return "\n".join(out).rstrip("\n"), sections


def render_world(world, *, output_lines: int = 15) -> str:
    """Verdict, root cause, first divergence, per-rank table, faults, replay, then stacks and outputs."""
    head, sections = report_parts(world, output_lines=output_lines)
    return "\n".join([head, *(f"\n--- {title} ---\n{text}" for title, text in sections)])
