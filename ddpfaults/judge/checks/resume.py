"""The resume check's verdict: is an interrupted, restarted run the run that would have happened?

Each rank of both runs recorded every optimizer step as digests (:mod:`ddpfaults.rank.resume`). The interrupted run's
attempts are laid on the uninterrupted run's steps: attempt 0 from step 0; a later attempt from the step its run had
reached when it wrote the file the attempt read before its first step (its checkpoint, whatever wrote it: the records
hold every file a rank met), else from the step after the one whose parameters it resumed with (its first step's
parameters before the step, found among the uninterrupted run's). A step that ran again after a restart replaces the
earlier one. Then step by step, rank by rank: a difference in the batch (what reached the model's forward), the
learning rate, the RNG states at the step's start, the parameters or the optimizer state is a difference, even where
the final state is equal, and the first one is explained by what the evidence shows (the batch: samples replayed or
skipped, from the batches the loaders drew, or the RNG that transformed the same batches; the learning rate: the
scheduler; the optimizer state; the RNG, named: torch's CPU generator, Python's ``random``, numpy's; the parameters the
run resumed with). Finally the state of every module the runs wrapped in DDP/FSDP is compared. Pure data: imports no
torch.
"""

from __future__ import annotations

import json
import math
import os

from ddpfaults import jobfiles
from ddpfaults.judge.checks import shared_files

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
    "shared_file",
)

#: the causes of a check that could not run (``equivalent`` None): no run to compare, nothing resumed, a file shared
UNCHECKED = ("uninterrupted_failed", "not_resumed", "shared_file")


def read(job_dir: str, world_size: int) -> list[list[dict]]:
    """Every rank's records in ``job_dir`` (a rank that wrote none: an empty list). A rank writes each file event as
    it meets it, and again, measured, in the next step's (or the final) record; the events after its last record (a
    rank killed before its next step) make a record of their own, ``{"files": [...]}``."""
    ranks = []
    for r in range(world_size):
        path = jobfiles.path(job_dir, r, "resume")
        records, pending = [], []
        if os.path.exists(path):
            with open(path) as f:
                for line in f:
                    if line.startswith(
                        jobfiles.RESUME_FILE_LINE
                    ):  # read only if no step record follows (the next holds it too)
                        pending.append(line)
                        continue
                    try:
                        records.append(json.loads(line))
                    except ValueError:  # a line cut short by a kill
                        break
                    pending = []
        files = []
        for line in pending:
            try:
                files.append(json.loads(line)["file"])
            except ValueError:
                break
        ranks.append(records + ([{"files": files}] if files else []))
    return ranks


def watch(attempts: list[list[list[dict]]]) -> frozenset:
    """The parameter digests each resumed attempt (all but the first) of an interrupted run (its records per attempt,
    per rank) entered each optimizer's first step with: where the uninterrupted run must record its optimizer and
    RNG states."""
    return frozenset(rec["before"] for ranks in attempts[1:] for records in ranks for rec in records if "before" in rec)


def _steps(records: list[dict]) -> list[dict]:
    return [r for r in records if "params" in r and not r.get("final")]


def _final(records: list[dict]) -> dict | None:
    return next((r for r in records if r.get("final")), None)


def _stepped_none(final: dict) -> bool:
    """True if the attempt whose ``final`` record this is made no optimizer step (it resumed after the last one): it
    knows no optimizer (they are found at their steps), so its final record says nothing of theirs."""
    return final.get("steps") == 0 and not final.get("optimizers")


def _lay(base: list[dict], attempts: list[list[dict]]) -> tuple[dict, dict, set, dict]:
    """The interrupted run's steps by the uninterrupted run's step number (``(attempt, record)``), each attempt's
    first step number, the attempts whose resumed parameters match no step of either run, and the step its run had
    reached when it last wrote each file (path -> step). A resumed attempt is laid where the file it read before its
    first step was written (its checkpoint: the last such, where there are several); else after the step whose
    parameters it resumed with: one of its own run's earlier steps, else one of the uninterrupted run's."""
    timeline, starts, unmatched, written = {}, {}, set(), {}
    after = {rec["params"]: i for i, rec in enumerate(base)}
    for a, records in enumerate(attempts):
        steps = _steps(records)
        loaded = [written[p] for p in shared_files.paths(records[0], ("read",)) if p in written] if records else []
        offset = max(timeline, default=-1) + 1
        if steps:
            first = steps[0].get("before")
            own = {rec["params"]: i for i, (_, rec) in sorted(timeline.items())}
            if a == 0:
                offset = 0
            elif loaded:
                offset = max(loaded)
            elif base and first == base[0].get("before"):
                offset = 0
            elif first in own or first in after:
                offset = _next_step_of(base, own.get(first, after.get(first)), steps[0].get("opt", 0))
            else:
                unmatched.add(a)
            starts[a] = offset
            for i, rec in enumerate(steps):
                timeline[offset + i] = (a, rec)
        elif loaded:
            offset = max(loaded)
        for i, rec in enumerate(records):  # a record's files were met after its step's predecessor: i steps done
            for path in shared_files.paths(rec, shared_files.WRITES):
                written[path] = offset + min(i, len(steps))
    return timeline, starts, unmatched, written


def _next_step_of(base: list[dict], step: int, opt: int) -> int:
    """The uninterrupted run's next step after ``step`` made by optimizer ``opt`` (optimizers stepping in turn, a
    GAN's, each count steps), else the next step."""
    return next((i for i in range(step + 1, len(base)) if base[i].get("opt", 0) == opt), step + 1)


def _entering(base: list[dict], step: int, mine: dict, theirs: dict):
    """The digest of the parameters the uninterrupted run's optimizer of ``mine`` entered ``step`` with: its
    previous step's (another optimizer's steps between), or at its first step the one recorded before it."""
    opt = mine.get("opt", 0)
    previous = next((base[i] for i in range(step - 1, -1, -1) if base[i].get("opt", 0) == opt), None)
    return previous.get("params") if previous is not None else theirs.get("before")


class _Rank:
    """One rank's walk along the uninterrupted run's steps: the first difference found (``found``: ``(step, rank,
    cause, detail, attempt)``), or where its steps began to differ in the last bits only (``rounding``: the step
    and attempt)."""

    def __init__(self, rank: int):
        self.rank = rank
        self.found: tuple | None = None
        self.rounding: tuple[int, int] | None = None


def _explain(step: int, walk: _Rank, mine: dict, theirs: dict, base: list[dict], attempt: int) -> tuple | None:
    """``(cause, detail)`` of a step that differs from the uninterrupted run's, or None when it is the same or its
    parameters differ where rounding may make them (``walk.rounding`` set). Each step is compared on its own, whatever
    the final state: the batch, the parameters and optimizer state an attempt resumed with, the learning rate, the
    RNG states at its start, the parameters after it."""
    rank = walk.rank
    if mine.get("batch") != theirs.get("batch"):
        seen = [i for i, rec in enumerate(base) if rec.get("batch") == mine.get("batch") and mine.get("batch")]
        differ = rngs_differing(mine, theirs)
        rng = f"; the RNG state differs too ({', '.join(differ)})" if differ else ""
        if not seen and mine.get("drawn"):  # the inputs were transformed: where the loader's last batch was drawn
            if mine["drawn"] == theirs.get("drawn") and differ:
                return "rng", (
                    f"the inputs that reached rank {rank}'s model at step {step} differ from the uninterrupted run's, "
                    f"from the same batches drawn, and the RNG state differs ({', '.join(differ)}): "
                    + "; ".join(_RNG_HINTS[name] for name in differ)
                )
            seen = [i for i, rec in enumerate(base) if mine["drawn"][-1] in (rec.get("drawn") or ())]
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
    resumed_here = "before" in mine  # an attempt's first step: what it resumed with is compared, bit for bit
    if resumed_here and walk.rounding is None:
        if mine["before"] != _entering(base, step, mine, theirs):
            return "resumed_state", (
                f"rank {rank}'s parameters entering step {step} differ from the uninterrupted run's, with the same "
                f"batch: the run resumed from other weights"
            )
        if "state" in theirs and mine.get("state") != theirs.get("state"):  # recorded where a run resumed
            return "optimizer_state", (
                f"the optimizer state entering step {step} differs (rank {rank}) with the same batch and parameters: "
                f"the optimizer's state (momentum, Adam's moments, its learning rates) was not restored"
            )
    if mine.get("lr") != theirs.get("lr"):
        return "learning_rate", (
            f"the learning rate at step {step} is {_lr(mine)} where the uninterrupted run had {_lr(theirs)}, with "
            f"the same batch, parameters and optimizer state: the LR scheduler's state was not restored"
        )
    differ = rngs_differing(mine, theirs)
    if differ:  # drawn from or not, a generator not restored is another run from here
        return "rng", (
            f"rank {rank} entered step {step} with the same batch, learning rate and parameters as the uninterrupted "
            f"run, but the RNG state differs ({', '.join(differ)}): " + "; ".join(_RNG_HINTS[name] for name in differ)
        )
    if walk.rounding is not None or mine.get("params") == theirs.get("params"):
        return None
    if attempt > 0:  # a resumed run: the last bits may differ (DDP made anew), the final state's values tell
        walk.rounding = (step, attempt)
        return None
    return "parameters", (
        f"the parameters after step {step} differ (rank {rank}) with the same batch and learning rate, before any "
        f"restart: the run is not reproducible (an unseeded RNG, a nondeterministic kernel) or a fault changed it"
    )


#: the largest relative difference of a resumed run's final state (per tensor: the norm of the difference over the
#: norm) put down to rounding, once its steps differ in the last bits with every input the check sees equal;
#: measured on torch 2.13, gloo CPU, 48 steps of SGD or Adam at 3-8 ranks: at most 4e-7
RTOL = 1e-5

#: why a resumed run's steps can differ in the last bits with every input the check sees equal (measured on torch
#: 2.13, gloo CPU: a DDP rebuilt at step k of the same process differs from one trained on by about 1e-8 at 3-8
#: ranks, not at 2)
REBUILT_DDP = (
    "a DDP made anew (as a resumed run makes it) reduces its first steps' gradients otherwise than one that kept "
    "training, which at 3 or more ranks changes their sums in the last bits"
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
    of it; a generator one record has and the other lacks (numpy imported in one run only) differs; none if a record
    holds no RNG states (a faulted run's records them at an attempt's first step only)."""
    if "rng" not in mine or "rng" not in theirs:
        return []
    a, b = mine["rng"] or {}, theirs["rng"] or {}
    return [name for key, name in RNGS.items() if a.get(key) != b.get(key)]


def _lr(record: dict) -> str:
    values = record.get("lr") or []
    return ", ".join(f"{v:g}" if isinstance(v, float) else str(v) for v in values) or "none"


def relative_difference(mine: list, theirs: list) -> float:
    """The largest per-tensor relative difference of two runs' :func:`ddpfaults.rank.resume.values` summaries (the
    RMS of the projections' differences, or the norms' difference if larger, over the larger norm); ``inf`` when a
    digest, a count or a kind differs."""
    if len(mine) != len(theirs):
        return math.inf
    worst = 0.0
    for a, b in zip(mine, theirs, strict=True):
        if isinstance(a, str) or isinstance(b, str) or len(a) != len(b):
            if a != b:
                return math.inf
            continue
        projected = math.sqrt(sum((x - y) ** 2 for x, y in zip(a[1:], b[1:], strict=True)) / max(len(a) - 1, 1))
        difference, scale = max(abs(a[0] - b[0]), projected), max(abs(a[0]), abs(b[0]))
        if difference:
            worst = max(worst, difference / scale if scale else math.inf)
    return worst


def _final_difference(base: dict, final: dict) -> float:
    """The relative difference (:func:`relative_difference`) of two final records' modules and optimizers (inf when
    either lacks the values of one of them)."""
    pairs = _value_pairs(base, final, "module")
    if pairs is not None and not _stepped_none(final):
        optimizers = _value_pairs(base, final, "optimizer")
        pairs = None if optimizers is None else pairs + optimizers
    if pairs is None:
        return math.inf
    return max((relative_difference(a, b) for a, b in pairs), default=0.0)


def _value_pairs(base: dict, final: dict, kind: str) -> list | None:
    """Two final records' values of each ``kind`` (``"module"``, ``"optimizer"``) side by side; None unless both
    hold values for every one their digests name."""
    mine, theirs = base.get(f"{kind}_values") or [], final.get(f"{kind}_values") or []
    if not len(mine) == len(theirs) == len(base.get(f"{kind}s") or []) == len(final.get(f"{kind}s") or []):
        return None
    return list(zip(mine, theirs, strict=True))


def _identical(base: dict | None, final: dict | None) -> bool:
    return (
        base is not None
        and final is not None
        and base.get("modules") == final.get("modules")
        and (base.get("optimizers") == final.get("optimizers") or _stepped_none(final))
    )


def _walk(rank: int, base_records: list[dict], mine: list[list[dict]], attempts: int) -> tuple[_Rank, float]:
    """One rank's comparison (:class:`_Rank`) and its final state's relative difference (0 when bit-equal)."""
    walk, base = _Rank(rank), _steps(base_records)
    timeline, starts, unmatched, _ = _lay(base, mine)
    for step in range(max(len(base), max(timeline, default=-1) + 1)):
        if step >= len(base):
            detail = f"rank {rank} ran step {step}, which the uninterrupted run never did ({len(base)} steps)"
            walk.found = (step, rank, "extra_step", detail, timeline[step][0])
            return walk, 0.0
        if step not in timeline and any(s > step and a not in unmatched for a, s in starts.items()):
            continue  # a later attempt resumed with the state after it: a peer's checkpoint held it (a rank killed
            # between two optimizers' steps of one batch, its replica saved after both)
        if step not in timeline:
            last = _steps(mine[-1]) if mine else []
            detail = f"rank {rank} never ran step {step} after {attempts} attempt(s) ({len(last)} step(s) in the last)"
            walk.found = (step, rank, "missing_step", detail, attempts - 1)
            return walk, 0.0
        a, rec = timeline[step]
        why = _explain(step, walk, rec, base[step], base, a)
        if a in unmatched and starts[a] == step:
            why = (
                "resumed_state",
                f"attempt {a} resumed rank {rank} with parameters neither run ever had (no checkpoint of its steps, "
                f"or a corrupt one)" + (f"; its first step: {why[1]}" if why else ""),
            )
        if why:
            walk.found = (step, rank, *why, a)
            return walk, 0.0
    final_base, final = _final(base_records), _final(mine[-1]) if mine else None
    if walk.rounding is None:
        return walk, 0.0 if _identical(final_base, final) else math.inf
    difference = _final_difference(final_base or {}, final or {}) if final_base and final else math.inf
    if difference > RTOL:
        step, a = walk.rounding
        beyond = (
            f"the final state differs by {difference:.1e} (relative), more than rounding ({RTOL:g})"
            if math.isfinite(difference)
            else "the final state cannot be compared (a run ended before its function returned, or its state differs "
            "in kind)"
        )
        walk.found = (
            step,
            rank,
            "parameters",
            f"the parameters after step {step} differ (rank {rank}) with the same batch and learning rate, in "
            f"an attempt that resumed with the uninterrupted run's parameters, optimizer state and RNG state, and "
            f"{beyond}: something the check does not see was not restored (an optimizer's hyperparameter, a "
            f"gradient scaler, a clipping bound...)",
            a,
        )
    return walk, difference


def compare(baseline: list[list[dict]], attempts: list[list[list[dict]]]) -> dict:
    """The finding: ``equivalent``, ``bit_equal``, ``steps`` (the uninterrupted run's, on its ranks' most),
    ``final_identical``, ``first_difference`` (None, or ``step``, ``ranks``, ``cause`` (one of :data:`CAUSES`),
    ``detail``, ``attempt``) and ``rounding`` (None, or where an equivalent run's resumed steps began to differ in
    the last bits: ``step``, ``ranks``, ``attempt``, ``relative_difference`` of the final state, at most
    :data:`RTOL`). ``baseline``: the uninterrupted run's records per rank; ``attempts``: the interrupted run's, per
    attempt. An uninterrupted run that read a file the interrupted run wrote is not compared
    (:func:`~ddpfaults.judge.checks.shared_files.shared_file`): the finding is unchecked (``equivalent`` None), cause
    ``shared_file``."""
    written_at = {}
    for rank in range(len(baseline)):
        written_at.update(_lay([], [attempt[rank] if rank < len(attempt) else [] for attempt in attempts])[3])
    shared = shared_files.shared_file(baseline, attempts, written_at)
    if shared is not None:
        return _unchecked("shared_file", shared)
    walks = []
    for rank, base_records in enumerate(baseline):
        mine = [attempt[rank] if rank < len(attempt) else [] for attempt in attempts]
        walks.append(_walk(rank, base_records, mine, len(attempts)))
    found = [w.found for w, _ in walks if w.found]
    last = attempts[-1] if attempts else []
    finals = [_final(r) for r in last] + [None] * len(baseline)
    final_identical = bool(baseline) and all(_identical(_final(b), f) for b, f in zip(baseline, finals, strict=False))
    steps = max((len(_steps(r)) for r in baseline), default=0)
    if not found and any(d > RTOL for _, d in walks):
        detail = (
            "the final state of the wrapped modules or optimizers differs from the uninterrupted run's (or a run ended "
            "before its function returned)"
        )
        found.append((steps, None, "final_state", detail, len(attempts) - 1))
    first, rounding = None, None
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
    elif any(w.rounding for w, _ in walks):
        step = min(w.rounding[0] for w, _ in walks if w.rounding)
        rounded = [w for w, _ in walks if w.rounding and w.rounding[0] == step]
        rounding = {
            "step": step,
            "ranks": [w.rank for w in rounded],
            "attempt": rounded[0].rounding[1],
            "relative_difference": max(d for _, d in walks),
            "world_size": len(baseline),
        }
    return {
        "equivalent": first is None,
        "bit_equal": first is None and rounding is None,
        "steps": steps,
        "final_identical": final_identical,
        "first_difference": first,
        "rounding": rounding,
    }


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
    return {
        "equivalent": None,
        "bit_equal": False,
        "steps": 0,
        "final_identical": False,
        "first_difference": first,
        "rounding": None,
    }


def describe(finding: dict) -> str:
    """The finding in one line of a report."""
    if finding["equivalent"] is None:
        return f"resume not checked: {finding['first_difference']['detail']}"
    rounding = finding.get("rounding")
    if finding["equivalent"] and rounding:
        why = f": {REBUILT_DDP}" if rounding["world_size"] >= 3 else ""
        ranks = ", ".join(map(str, rounding["ranks"]))
        return (
            f"resumed equivalent to rounding: {finding['steps']} steps; every resume restored the batch, parameters, "
            f"optimizer state, learning rate and RNG bit-equal; from step {rounding['step']} (rank {ranks}) the "
            f"parameters differ in the last bits, the final state by {rounding['relative_difference']:.1e} "
            f"(relative; rounding: up to {RTOL:g}){why}"
        )
    if finding["equivalent"]:
        return f"resumed bit-equal: {finding['steps']} steps, final state identical"
    first = finding["first_difference"]
    if first["step"] is None:
        return f"resume not checked: {first['detail']}"
    return f"resume differs from step {first['step']}: {first['detail']}"
