"""The resume check's verdict: is an interrupted, restarted run the run that would have happened?

Each rank of both runs recorded every optimizer step as digests (:mod:`ddpfaults.rank.resume`). The interrupted
run's attempts are laid on the uninterrupted run's steps: attempt 0 from step 0; a later attempt from the step after
the one whose parameters it resumed with (its first step's parameters before the step, found among the
uninterrupted run's). A step that ran again after a restart replaces the earlier one. Then step by step, rank by
rank: a difference in the batch, the learning rate, the parameters or the optimizer state is a difference, and the
first one is explained by what the evidence shows (the batch: samples replayed or skipped; the learning rate: the
scheduler; the optimizer state; the RNG, named: torch's CPU generator, Python's ``random``, numpy's; the parameters
the run resumed with). Finally the state of every module the runs wrapped in DDP/FSDP is compared. Pure data:
imports no torch.
"""

from __future__ import annotations

import json
import os

#: what a difference is put down to (a finding's ``cause``)
CAUSES = (
    "samples_replayed",
    "samples_skipped",
    "data_order",
    "learning_rate",
    "optimizer_state",
    "rng",
    "resumed_state",
    "parameters",
    "missing_step",
    "extra_step",
    "final_state",
    "uninterrupted_failed",
    "not_resumed",
)


def read(job_dir: str, world_size: int) -> list[list[dict]]:
    """Every rank's records in ``job_dir`` (a rank that wrote none: an empty list)."""
    ranks = []
    for r in range(world_size):
        path = os.path.join(job_dir, f"rank{r}.resume")
        records = []
        if os.path.exists(path):
            with open(path) as f:
                for line in f:
                    try:
                        records.append(json.loads(line))
                    except ValueError:  # a line cut short by a kill
                        break
        ranks.append(records)
    return ranks


def _steps(records: list[dict]) -> list[dict]:
    return [r for r in records if not r.get("final")]


def _final(records: list[dict]) -> dict | None:
    return next((r for r in records if r.get("final")), None)


def _stepped_none(final: dict) -> bool:
    """True if the attempt whose ``final`` record this is made no optimizer step (it resumed after the last one): it
    knows no optimizer (they are found at their steps), so its final record says nothing of theirs."""
    return final.get("steps") == 0 and not final.get("optimizers")


def _lay(base: list[dict], attempts: list[list[dict]]) -> tuple[dict, list]:
    """The interrupted run's steps by the uninterrupted run's step number (``(attempt, record)``), and the attempts
    whose resumed parameters match no step of the uninterrupted run ``(attempt, first record)``."""
    timeline, unmatched = {}, []
    after = {rec["params"]: i for i, rec in enumerate(base)}
    for a, records in enumerate(attempts):
        steps = _steps(records)
        if not steps:
            continue
        first = steps[0].get("before")
        if a == 0 or (base and first == base[0].get("before")):
            offset = 0
        elif first in after:
            offset = after[first] + 1
        else:
            unmatched.append((a, steps[0]))
            offset = max(timeline, default=-1) + 1
        for i, rec in enumerate(steps):
            timeline[offset + i] = (a, rec)
    return timeline, unmatched


def _explain(step: int, rank: int, mine: dict, theirs: dict, base: list[dict], rebuilt: bool) -> tuple[str, str] | None:
    """``(cause, detail)`` of a step that differs from the uninterrupted run's, or None when it is the same
    (``rebuilt``: the step is a resumed attempt's first, in a world of 3 or more ranks)."""
    if mine.get("batch") != theirs.get("batch"):
        seen = [i for i, rec in enumerate(base) if rec.get("batch") == mine.get("batch") and mine.get("batch")]
        differ = rngs_differing(mine, theirs)
        rng = f"; the RNG state differs too ({', '.join(differ)})" if differ else ""
        if seen and seen[0] < step:
            return "samples_replayed", (
                f"rank {rank} consumed at step {step} the batch the uninterrupted run consumed at step {seen[0]}: "
                f"samples replayed (the data position was not restored){rng}"
            )
        if seen:
            return "samples_skipped", (
                f"rank {rank} consumed at step {step} the batch the uninterrupted run consumed at step {seen[0]}: "
                f"samples skipped{rng}"
            )
        return "data_order", (
            f"the batch rank {rank} consumed at step {step} differs from the uninterrupted run's: the data order was "
            f"not restored (a reshuffle, or the sampler's RNG){rng}"
        )
    entering = base[step - 1].get("params") if step > 0 else theirs.get("before")
    if "before" in mine and mine["before"] != entering:
        return "resumed_state", (
            f"rank {rank}'s parameters entering step {step} differ from the uninterrupted run's, with the same batch: "
            f"the run resumed from other weights"
        )
    if mine.get("state") != theirs.get("state"):
        return "optimizer_state", (
            f"the optimizer state entering step {step} differs (rank {rank}) with the same batch and parameters: the "
            f"optimizer's state (momentum, Adam's moments, its learning rates) was not restored"
        )
    if mine.get("lr") != theirs.get("lr"):
        return "learning_rate", (
            f"the learning rate at step {step} is {_lr(mine)} where the uninterrupted run had {_lr(theirs)}, with "
            f"the same batch, parameters and optimizer state: the LR scheduler's state was not restored"
        )
    if mine.get("params") != theirs.get("params"):
        differ = rngs_differing(mine, theirs)
        if differ:
            return "rng", (
                f"the parameters after step {step} differ (rank {rank}) with the same batch, learning rate, "
                f"parameters and optimizer state, and the RNG state differs ({', '.join(differ)}): "
                + "; ".join(_RNG_HINTS[name] for name in differ)
            )
        detail = (
            f"the parameters after step {step} differ (rank {rank}) with the same batch, learning rate, optimizer "
            f"state and RNG state"
        )
        if rebuilt:
            detail += f"; {REBUILT_DDP}"
        return "parameters", detail
    return None


#: why an attempt's first step can differ with every input the check sees equal (measured on torch 2.13, gloo CPU:
#: a DDP rebuilt at step 3 of the same process differs from one trained on in the last bits at 4 ranks, not at 2)
REBUILT_DDP = (
    "every input the check sees is equal: a DDP made anew (as a resumed run makes it) reduces its first step's "
    "gradients otherwise than one that kept training, which at 3 or more ranks changes their sums in the last bits "
    "(about 1e-8, measured); if the script restores everything else, this is the only difference"
)


#: each global RNG a step's record digests, by its name in a report, and what its difference means
RNGS = {"torch": "torch CPU", "random": "python random", "numpy": "numpy"}
_RNG_HINTS = {
    "torch CPU": "torch's RNG was not restored, or was restored before the DataLoader iterator was made (making one "
    "draws from it), so dropout masks differ",
    "python random": "Python's random state was not restored (random.getstate / random.setstate)",
    "numpy": "numpy's global RNG was not restored (numpy.random.get_state / numpy.random.set_state)",
}


def rngs_differing(mine: dict, theirs: dict) -> list[str]:
    """The names (:data:`RNGS`' values) of the global RNGs whose state before a step differs between two records
    of it; a generator one record has and the other lacks (numpy imported in one run only) differs."""
    a, b = mine.get("rng") or {}, theirs.get("rng") or {}
    return [name for key, name in RNGS.items() if a.get(key) != b.get(key)]


def _lr(record: dict) -> str:
    values = record.get("lr") or []
    return ", ".join(f"{v:g}" if isinstance(v, float) else str(v) for v in values) or "none"


def compare(baseline: list[list[dict]], attempts: list[list[list[dict]]]) -> dict:
    """The finding: ``equivalent``, ``steps`` (the uninterrupted run's, on its ranks' most), ``final_identical``, and
    ``first_difference`` (None, or ``step``, ``ranks``, ``cause`` (one of :data:`CAUSES`), ``detail``, ``attempt``).
    ``baseline``: the uninterrupted run's records per rank; ``attempts``: the interrupted run's, per attempt."""
    found = []  # (step, rank, cause, detail, attempt)
    for rank, base_records in enumerate(baseline):
        base = _steps(base_records)
        mine = [attempt[rank] if rank < len(attempt) else [] for attempt in attempts]
        timeline, unmatched = _lay(base, mine)
        for step in range(max(len(base), max(timeline, default=-1) + 1)):
            if step >= len(base):
                a = timeline[step][0]
                found.append(
                    (
                        step,
                        rank,
                        "extra_step",
                        f"rank {rank} ran step {step}, which the uninterrupted run never did ({len(base)} steps)",
                        a,
                    )
                )
                break
            if step not in timeline:
                last = attempts[-1] if attempts else []
                found.append(
                    (
                        step,
                        rank,
                        "missing_step",
                        f"rank {rank} never ran step {step} after "
                        f"{len(attempts)} attempt(s) ({len(_steps(last[rank]) if rank < len(last) else [])} "
                        f"step(s) in the last)",
                        len(attempts) - 1,
                    )
                )
                break
            a, rec = timeline[step]
            first = a > 0 and step == min(s for s, (k, _) in timeline.items() if k == a)
            why = _explain(step, rank, rec, base[step], base, rebuilt=first and len(baseline) >= 3)
            if why:
                if any(u[0] == a for u in unmatched):
                    why = (
                        "resumed_state",
                        f"attempt {a} resumed rank {rank} with parameters the uninterrupted run "
                        f"never had (no checkpoint of its steps, or a corrupt one); its first step: {why[1]}",
                    )
                found.append((step, rank, *why, a))
                break
    final_base = [_final(r) for r in baseline]
    final_last = [_final(r) for r in (attempts[-1] if attempts else [])]
    final_identical = bool(final_base) and all(
        b is not None
        and f is not None
        and b.get("modules") == f.get("modules")
        and (b.get("optimizers") == f.get("optimizers") or _stepped_none(f))
        for b, f in zip(final_base, final_last + [None] * len(final_base), strict=False)
    )
    steps = max((len(_steps(r)) for r in baseline), default=0)
    if not found and not final_identical:
        found.append(
            (
                steps,
                None,
                "final_state",
                "the final state of the wrapped modules or optimizers differs "
                "from the uninterrupted run's (or a run ended before its function returned)",
                len(attempts) - 1,
            )
        )
    first = None
    if found:
        step = min(f[0] for f in found)
        at = [f for f in found if f[0] == step]
        first = {
            "step": step,
            "ranks": sorted({f[1] for f in at if f[1] is not None}),
            "cause": at[0][2],
            "detail": at[0][3],
            "attempt": at[0][4],
        }
    return {"equivalent": first is None, "steps": steps, "final_identical": final_identical, "first_difference": first}


def unchecked(outcome: str, root_cause: str) -> dict:
    """The finding when the run without faults did not complete: nothing to compare with."""
    detail = f"the run without faults {outcome} ({root_cause}): there is no uninterrupted run to compare with"
    return _unchecked("uninterrupted_failed", detail)


def not_resumed(outcome: str) -> dict:
    """The finding when the faulted run was never restarted (it ran once and {outcome}): nothing resumed, so nothing
    can be called equivalent."""
    detail = f"the faulted run was never restarted (it ran once and {outcome}): no attempt resumed from a checkpoint"
    return _unchecked("not_resumed", detail)


def _unchecked(cause: str, detail: str) -> dict:
    first = {"step": None, "ranks": [], "cause": cause, "detail": detail, "attempt": None}
    return {"equivalent": False, "steps": 0, "final_identical": False, "first_difference": first}


def describe(finding: dict) -> str:
    """The finding in one line of a report."""
    if finding["equivalent"]:
        return f"resumed bit-equal: {finding['steps']} steps, final state identical"
    first = finding["first_difference"]
    if first["step"] is None:
        return f"resume not checked: {first['detail']}"
    return f"resume differs from step {first['step']}: {first['detail']}"
